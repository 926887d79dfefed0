"""When the adapted encoder is trained again (issue 32): ``RAG_ADAPT_RETRAIN``.

An edit never retrains by itself: new and changed chunks are embedded with the current adapted
model. A retrain happens when one of the policy's terms says so, or when there is nothing to
keep (no training yet, another base model, another recipe), or on request
(``rag-assets adapt --force``):

- ``changed:F``: at least the share F (0..1) of the current chunks is new or changed since the
  last training (compared by content hash of the embedded text); default ``changed:0.2``.
- ``cron:EXPR``: a tick of the cron expression passed since the last training (the asset's
  automation condition fires on the tick; :func:`retrain_due` takes the last tick's time).
- ``never``: only the three cases above.

Terms combine with commas: ``changed:0.2,cron:0 3 * * 0``. A retrain is one run of the graph
(``adapted_encoder``); the new model reaches queries only through the evaluation gate.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Collection
from dataclasses import dataclass

SETTING = "RAG_ADAPT_RETRAIN"
DEFAULT_POLICY = "changed:0.2"


@dataclass(frozen=True)
class RetrainPolicy:
    changed: float | None = 0.2  # retrain at this share of chunks new or changed; None = off
    cron: str = ""  # retrain after a tick of this cron expression; "" = no schedule

    @property
    def label(self) -> str:
        terms = []
        if self.changed is not None:
            terms.append(f"changed:{self.changed:g}")
        if self.cron:
            terms.append(f"cron:{self.cron}")
        return ",".join(terms) or "never"


def parse_policy(text: str | None) -> RetrainPolicy:
    """``RAG_ADAPT_RETRAIN`` → :class:`RetrainPolicy` ("" = ``changed:0.2``)."""
    value = (text or "").strip() or DEFAULT_POLICY
    if value.lower() == "never":
        return RetrainPolicy(changed=None)
    changed: float | None = None
    cron = ""
    for term in re.split(r",(?=\s*(?:changed|cron|never)\s*:?)", value):
        key, _, arg = term.strip().partition(":")
        key, arg = key.strip().lower(), arg.strip()
        if key == "changed":
            try:
                changed = float(arg)
            except ValueError:
                changed = -1.0
            if not 0.0 < changed <= 1.0:
                raise ValueError(
                    f"{SETTING}={text!r}: changed: takes a share of the chunks in (0, 1], "
                    "e.g. changed:0.2"
                )
        elif key == "cron" and len(arg.split()) == 5:
            cron = arg
        else:
            raise ValueError(
                f"{SETTING}={text!r}: use changed:F (share of chunks changed since the last "
                "training, e.g. changed:0.2), cron:EXPR (five-field cron), both separated by a "
                "comma, or never"
            )
    return RetrainPolicy(changed, cron)


def changed_share(current: Collection[str], trained: Collection[str]) -> float:
    """Share of ``current`` chunk hashes not among those the model was trained on."""
    if not current:
        return 0.0
    known = set(trained)
    return sum(1 for h in current if h not in known) / len(current)


def retrain_due(
    policy: RetrainPolicy,
    share: float,
    *,
    trained_at: str | None,
    same_base_and_recipe: bool,
    last_tick: dt.datetime | None = None,
    force: bool = False,
) -> tuple[bool, str]:
    """Whether to train now, and why (one line either way).

    ``share``: :func:`changed_share` of the chunks against the last training; ``trained_at``:
    its ISO time (None: never trained); ``last_tick``: the schedule's latest tick at or before
    now (aware datetime), when the policy has one."""
    if force:
        return True, "retrain requested (rag-assets adapt --force)"
    if trained_at is None:
        return True, "no adapted model yet"
    if not same_base_and_recipe:
        return True, "the base model or the recipe changed since the last training"
    pct = f"{100 * share:.1f} % of the chunks"
    if policy.changed is not None and share >= policy.changed:
        return True, f"{pct} are new or changed since the last training (≥ {policy.changed:g})"
    if policy.cron and last_tick is not None and last_tick > _parse_time(trained_at):
        return True, f"a tick of cron:{policy.cron} ({last_tick.isoformat()}) passed"
    rule = f"retrain at {policy.label} ({SETTING})"
    return False, f"{pct} changed since the last training at {trained_at}: kept; {rule}"


def _parse_time(text: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)
