"""split_tensor_parallel: heads and experts split across ranks.

Needs: lowered groups. Guarantees (tp = 1): the plan is unchanged and records tp = 1. Larger tp is
refused by validate until the split (and its all-reduce before each hyper-connection post-mix)
exists."""
from __future__ import annotations

from kbpc.ir.plan import Plan


def split_tensor_parallel(plan: Plan) -> Plan:
    return plan
