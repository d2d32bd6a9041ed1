"""The dynamic-shape report as text lines (``DynamicReport.table``): the candidate buckets, then the bucket sets
compared against the upper-bound plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from npu_compiler.costmodel.costs import plain_line

from .dynamic_report import human_bytes

if TYPE_CHECKING:
    from .dynamic_buckets import BucketSet
    from .dynamic_report import DynamicReport


def report_lines(report: DynamicReport) -> list[str]:
    """The header, one row per candidate bucket, the sets compared, and the notes."""
    lines = [*_header(report), "", *_bucket_rows(report), "", *_set_rows(report)]
    lines += [f"note: {plain_line(n)}" for n in report.notes]
    return lines


def _header(report: DynamicReport) -> list[str]:
    hist = report.histogram
    requests = sum(hist.values())
    bound = ", ".join(f"{k}={v}" for k, v in sorted(report.bind.items()))
    dtype = f"costed at {report.dtype}" if report.dtype else "each dispatch costed at its own dtype"
    return [plain_line(f"{report.model_name}: buckets of {report.symbol} (range {report.low}..{report.high})"
                       f"{', ' + bound if bound else ''}; cost model {report.hardware}, {dtype}"),
            f"traffic: {requests:,} requests, {len(hist)} distinct lengths ({min(hist)}..{max(hist)}), mean "
            f"{sum(n * c for n, c in hist.items()) / requests:.1f}"]


def _bucket_rows(report: DynamicReport) -> list[str]:
    head = f"{report.symbol:>8} {'arena':>11} {'MFLOPs':>10} {'latency ms':>11} {'given':>7} {'suggested':>9}"
    lines = ["candidate buckets (static program at each size; share: requests it serves in the set)", head]
    given = report.given.share if report.given else {}
    for size in report.candidates:
        c = report.sizes[size]
        lines.append(f"{size:>8} {human_bytes(c.arena_bytes):>11} {c.flops / 1e6:>10.2f} {c.latency_ms:>11.4f} "
                     f"{_pct(given.get(size)):>7} {_pct(report.suggested.share.get(size)):>9}")
    return lines


def _set_rows(report: DynamicReport) -> list[str]:
    lines = ["bucket sets (per request, over the traffic; arena: shared by the variants / one each)",
             f"{'set':<12} {'buckets':<24} {'latency ms':>11} {'vs upper':>9} {'padded':>7} {'arena':>11} "
             f"{'arena sum':>11}"]
    upper = report.upper_bound.expected_latency_ms
    for s in report.sets:
        lines.append(f"{s.name:<12} {_sizes(s, report):<24} {s.expected_latency_ms:>11.4f} "
                     f"{_ratio(s.expected_latency_ms, upper):>9} {s.waste:>7.1%} {human_bytes(s.arena_shared):>11} "
                     f"{human_bytes(s.arena_sum):>11}")
    cap = f", arena <= {human_bytes(report.memory_cap)}" if report.memory_cap else ""
    lines.append(f"suggested: the least expected latency over {len(report.candidates)} candidate sizes, at most "
                 f"{report.max_buckets} buckets{cap} (exact search)")
    how = (f"{len(report.histogram)} distinct lengths: costed at {len(report.upper_bound_points)} sizes, "
           "interpolated linearly between them" if report.interpolated else "costed at each distinct length")
    lines.append(f"upper bound: one arena planned for {report.symbol}={report.high}, dispatches sized at run time, "
                 f"each length paying the program compiled at exactly its length ({how})")
    return lines


def _sizes(s: BucketSet, report: DynamicReport) -> str:
    if s is report.upper_bound:
        return f"run-time <= {report.high}"
    text = ",".join(map(str, s.sizes))
    return text if len(text) <= 24 else text[:21] + "..."


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference > 0 else "-"


__all__ = ["report_lines"]
