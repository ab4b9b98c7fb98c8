"""`flopwatch remediate`: act on FlopWatch's pages through the scheduler (docs/remediation.md).

One job per module: settings (the policy), alerts (Alertmanager in and out), decide (the pure
decision: policy, breaker, switch escalation, lemons, returns), journal (history), scheduler (the
adapters' contract) with slurm and kubernetes, service (the loop) and web (webhook, /metrics).
"""
