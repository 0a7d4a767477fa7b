"""What a compression produced, over the whole output file: the metrics file and the end table.

Figures are rebuilt from the output's own records on every invocation (each carries its
``compression`` metadata), so after a resume they cover every record, not just the last part.
The reduction distribution is a histogram of whole percents: memory stays flat for any size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PERCENTILES = (10, 50, 90)
SKIPPED_KEPT = 1000


@dataclass
class Metrics:
    records: int = 0
    over_budget_before: int = 0
    under_budget: int = 0
    compressed: int = 0
    flagged: int = 0
    """Records written unchanged because compression failed or timed out."""
    still_over: int = 0
    """Records compressed as far as the strategy could go and still over budget."""
    tokens_before: int = 0
    tokens_after: int = 0
    summaries: int = 0
    masked: int = 0
    requests: int = 0
    cost: float = 0.0
    invalid_lines: int = 0
    """Input lines that hold no trajectory (not JSON, not an object, no conversations): skipped,
    so the output lacks them and is incomplete."""
    skipped_input_lines: list[int] = field(default_factory=list)
    """Their line numbers, the first :data:`SKIPPED_KEPT` of them."""
    spent: dict[str, float] | None = None
    """What this invocation's model client paid for (requests, tokens, cost); None without a model."""
    reductions: list[int] = field(default_factory=lambda: [0] * 101)
    """reductions[p]: compressed records whose token count fell by p percent."""

    @property
    def complete(self) -> bool:
        """Whether every input line that is not blank has its record in the output."""
        return not self.invalid_lines

    def skip(self, line: int) -> None:
        self.invalid_lines += 1
        if len(self.skipped_input_lines) < SKIPPED_KEPT:
            self.skipped_input_lines.append(line)

    def add(self, meta: dict[str, Any]) -> None:
        """Count one output record by its ``compression`` metadata."""
        self.records += 1
        before, after = int(meta.get("tokens_before") or 0), int(meta.get("tokens_after") or 0)
        self.tokens_before += before
        self.tokens_after += after
        self.over_budget_before += before > int(meta.get("max_tokens") or 0)
        self.under_budget += bool(meta.get("under_budget"))
        self.flagged += meta.get("error") is not None
        self.still_over += meta.get("error") is None and not meta.get("under_budget")
        self.summaries += int(meta.get("summaries") or 0)
        self.masked += int(meta.get("masked") or 0)
        self.requests += int(meta.get("requests") or 0)
        self.cost += float(meta.get("cost") or 0.0)
        if meta.get("compressed") and before > 0:
            self.compressed += 1
            self.reductions[max(0, min(100, round(100 * (before - after) / before)))] += 1

    def percentile(self, p: int) -> int | None:
        total = sum(self.reductions)
        if not total:
            return None
        seen = 0
        for percent, count in enumerate(self.reductions):
            seen += count
            if seen * 100 >= p * total:
                return percent
        return 100

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "reductions"}
        data["complete"] = self.complete
        data["cost"] = round(self.cost, 6)
        data["reduction_percent"] = {f"p{p}": self.percentile(p) for p in PERCENTILES}
        data["reduction_histogram"] = {str(p): n for p, n in enumerate(self.reductions) if n}
        return data

    def rows(self) -> list[tuple[str, str]]:
        """The end-of-run table, as (what, figure) pairs."""
        share = f"{self.under_budget}/{self.records}"
        spread = ", ".join(f"p{p} {self.percentile(p)}%" for p in PERCENTILES) if self.compressed else "-"
        rows = [
            ("records", str(self.records)),
            ("over budget before", str(self.over_budget_before)),
            ("under budget after", share),
            ("compressed", str(self.compressed)),
            ("still over budget", str(self.still_over)),
            ("failed, kept unchanged", str(self.flagged)),
            ("token reduction (compressed records)", spread),
            ("tokens before -> after", f"{self.tokens_before} -> {self.tokens_after}"),
            ("tool outputs masked", str(self.masked)),
            ("summaries", str(self.summaries)),
            ("summary requests (paid)", str(self.requests)),
            ("cost", f"${self.cost:.4f}"),
        ]
        if self.spent is not None:
            rows.append(
                (
                    "paid by this invocation",
                    f"{int(self.spent['requests'])} requests, ${float(self.spent['cost']):.4f}",
                )
            )
        if self.invalid_lines:
            rows.append(("input lines skipped (not JSON records)", str(self.invalid_lines)))
        return rows
