"""Evaluation of what it is handed: pass@k, completions scored in the sandbox, selection
among k samples (first, majority by behaviour, reward model, oracle). Sampling a policy to
evaluate it is rlcode.policy.policy_eval's.

  passk.py           pass@k (unbiased), majority vote, best-of-n
  scoring.py         completions files scored against tasks; reports
  selection.py       selector@k arithmetic over per-sample facts
  selection_eval.py  selection run on given samples: scores, signatures, table
  behaviour.py       behaviour signatures of programs, for majority voting
"""
