"""The judge audit: how much two judges agree, how noisy one judge is, how often it errs.

Modules: ``run`` (sample the captions, run the judges), ``compare`` (two runs' figures),
``pairing`` (which assertion of one judge is which of the other's), ``agreement`` (kappa,
correlations, rank agreement), ``report`` (tables and files). The command is
``balcaprl judge audit``.
"""

from balcaprl.judge.audit.agreement import (
    cohen_kappa,
    kendall_tau_b,
    mean_abs_diff,
    pairwise_order_agreement,
    pearson,
    spearman,
)
from balcaprl.judge.audit.compare import FLAGS, SCORES, compare_outcomes, item_scores
from balcaprl.judge.audit.pairing import Pairing, pair_assertions
from balcaprl.judge.audit.report import audit_results, audit_tables, write_audit
from balcaprl.judge.audit.run import AuditItem, JudgeFactory, judge_names, read_audit_items, run_audit

__all__ = [
    "FLAGS",
    "SCORES",
    "AuditItem",
    "JudgeFactory",
    "Pairing",
    "audit_results",
    "audit_tables",
    "cohen_kappa",
    "compare_outcomes",
    "item_scores",
    "judge_names",
    "kendall_tau_b",
    "mean_abs_diff",
    "pair_assertions",
    "pairwise_order_agreement",
    "pearson",
    "read_audit_items",
    "run_audit",
    "spearman",
    "write_audit",
]
