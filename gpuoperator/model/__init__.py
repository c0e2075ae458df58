"""The pure model: every rule of the operator as a function of plain data.

No I/O and no client imports (an import-linter contract keeps it so), so each rule is
unit-testable on its own. Functions here are idempotent: the same inputs give the same
decision, which is what lets reconcilers be level-triggered.
"""
