"""Evaluation: pass@k, scoring completions in the sandbox, held-out evaluation of a policy,
selection among k samples (first, majority by behaviour, reward model, oracle).

  passk.py           pass@k (unbiased), majority vote, best-of-n
  scoring.py         completions files scored against tasks; reports
  policy_eval.py     a policy's (or a checkpoint's) held-out evaluation
  selection.py       selector@k arithmetic over per-sample facts
  selection_eval.py  selection run end to end: samples, scores, signatures, table
  behaviour.py       behaviour signatures of programs, for majority voting
"""
