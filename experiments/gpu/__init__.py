"""The GPU check (check.sh) and its parts: attention against cuDNN, decode against its bound and profiled, offloaded KV."""
