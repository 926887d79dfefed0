"""Settings, with working defaults. ``Settings.from_env`` is pure: it is handed a mapping.

``rag_assets/definitions.py`` (for Dagster) and ``rag_assets/cli.py`` (for the command line)
are the places that pass ``os.environ`` in.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

ENV = {
    "documents_dir": ("RAG_DOCUMENTS_DIR", "data/documents"),
    "index_uri": ("RAG_INDEX_URI", "data/index"),
    # issue 31: "" = the index's own working folder (index_work_dir), never the current directory
    "work_dir": ("RAG_WORK_DIR", ""),
    "chunk_strategy": ("RAG_CHUNK_STRATEGY", "E"),
    "chunk_target": ("RAG_CHUNK_TARGET", "512"),
    "embedding_model": ("RAG_EMBEDDING_MODEL", ""),
    "embed_batch_size": ("RAG_EMBED_BATCH_SIZE", "16"),
    "embed_threads": ("RAG_EMBED_THREADS", "0"),
    "rerank_model": ("RAG_RERANK_MODEL", ""),
    "distance_cut": ("RAG_DISTANCE_CUT", ""),
    "eval_dir": ("RAG_EVAL_DIR", "data/eval"),
    # issue 19: seconds of model time one run may spend writing the generated evaluation set
    "eval_budget_s": ("RAG_EVAL_BUDGET_S", "300"),
    "recall_floor": ("RAG_RECALL_FLOOR", "0.5"),
    "max_bluff_rate": ("RAG_MAX_BLUFF_RATE", "0.10"),
    "failed_policy": ("RAG_FAILED_POLICY", "keep"),
    "reindex_cron": ("RAG_REINDEX_CRON", "0 * * * *"),
    "base_url": ("RAG_BASE_URL", ""),
    "llm_url": ("RAG_LLM_URL", ""),
    "llm_model": ("RAG_LLM_MODEL", ""),
    "llm_api_key": ("RAG_LLM_API_KEY", ""),
    # embedding model options (issue 8): prompts and a Matryoshka truncation are part of the stamps
    "embed_dims": ("RAG_EMBED_DIMS", "0"),
    "query_prompt": ("RAG_QUERY_PROMPT", ""),
    "document_prompt": ("RAG_DOCUMENT_PROMPT", ""),
    "fusion": ("RAG_FUSION", "rrf"),
    # the local model that reads question and sources together (issues 9 and 15)
    "rerank_depth": ("RAG_RERANK_DEPTH", "25"),
    "answer_check": ("RAG_ANSWER_CHECK", ""),
    "expand": ("RAG_EXPAND", ""),
    "expand_llm_url": ("RAG_EXPAND_LLM_URL", ""),
    "expand_llm_model": ("RAG_EXPAND_LLM_MODEL", ""),
    "expand_n": ("RAG_EXPAND_N", "3"),
    "query_rewrite": ("RAG_QUERY_REWRITE", ""),
    # the HTTP service (issue 10)
    "api_token": ("RAG_API_TOKEN", ""),
    # issue 34: the token `rag-assets mcp` over stdio answers as (unset: the local operator)
    "token": ("RAG_TOKEN", ""),
    "query_encoder": ("RAG_QUERY_ENCODER", "onnx"),
    # extraction (issue 14)
    "ocr_min_confidence": ("RAG_OCR_MIN_CONFIDENCE", "0.80"),
    # issue 22: publish another documents folder into an index built from one (1 = allow)
    "force_folder": ("RAG_FORCE_FOLDER", ""),
    # where torch encodes and in what precision (issue 23): the precision is a stamp, not the device
    "device": ("RAG_DEVICE", "auto"),
    "embed_precision": ("RAG_EMBED_PRECISION", "fp32"),
    "backfill_batch_rows": ("RAG_BACKFILL_BATCH_ROWS", "2048"),  # chunks per backfill run
    # issue 25: one writer at a time, hosts the service answers; issue 22: what gets indexed
    "lease_seconds": ("RAG_LEASE_SECONDS", "60"),
    "lease_wait": ("RAG_LEASE_WAIT", "0"),
    "allowed_hosts": ("RAG_ALLOWED_HOSTS", ""),
    "include": ("RAG_INCLUDE", ""),
    "exclude": ("RAG_EXCLUDE", ""),
    # issue 33: the query log kept with the index (on/off), its retention, redaction
    "query_log": ("RAG_QUERY_LOG", "on"),
    "query_log_days": ("RAG_QUERY_LOG_DAYS", "90"),
    "query_log_redact": ("RAG_QUERY_LOG_REDACT", "off"),
    # issue 43: verdicts one group token may give a minute (POST /feedback, MCP); 0 = no limit
    "feedback_per_minute": ("RAG_FEEDBACK_PER_MINUTE", "30"),
    # issue 35: embeddings and reranking from a model server (OpenAI /v1/embeddings, /rerank)
    "embed_url": ("RAG_EMBED_URL", ""),
    "embed_model": ("RAG_EMBED_MODEL", ""),
    "embed_api_key": ("RAG_EMBED_API_KEY", ""),
    "embed_concurrency": ("RAG_EMBED_CONCURRENCY", "2"),
    "embed_timeout": ("RAG_EMBED_TIMEOUT", "300"),
    "embed_retries": ("RAG_EMBED_RETRIES", "4"),
    "embed_window": ("RAG_EMBED_WINDOW", "0"),
    "embed_probe_interval": ("RAG_EMBED_PROBE_INTERVAL", "60"),
    "rerank_url": ("RAG_RERANK_URL", ""),
    "rerank_api_key": ("RAG_RERANK_API_KEY", ""),
    "rerank_timeout": ("RAG_RERANK_TIMEOUT", "5"),
    # issue 32: the encoder adapted to the corpus, its step budget and retrain policy; issue 44:
    # on by default where it pays (auto: enough pairs, a training that fits the time budget)
    "adapt": ("RAG_ADAPT", "auto"),
    "adapt_budget_s": ("RAG_ADAPT_BUDGET_S", "1800"),
    "adapt_steps": ("RAG_ADAPT_STEPS", "0"),
    "adapt_max_steps": ("RAG_ADAPT_MAX_STEPS", "500"),
    "adapt_retrain": ("RAG_ADAPT_RETRAIN", "changed:0.2"),
    # issue 30: how long a request body may take to arrive; how long a page login lasts
    "body_timeout_s": ("RAG_BODY_TIMEOUT_S", "30"),
    "session_ttl_s": ("RAG_SESSION_TTL_S", "43200"),
    # issue 41: several sources (buckets, Git repositories, websites) from one sources file;
    # the share of a source's documents one listing may delete; the sources allowed more
    "sources": ("RAG_SOURCES", ""),
    "source_max_delete_share": ("RAG_SOURCE_MAX_DELETE_SHARE", "0.5"),
    "source_confirm_delete": ("RAG_SOURCE_CONFIRM_DELETE", ""),
    # issue 49: a private object's citation as a presigned URL valid this long (0: none)
    "source_presign_seconds": ("RAG_SOURCE_PRESIGN_SECONDS", "0"),
    # issue 52: GET /metrics (on/off) and its own bearer token, the question in traces, log lines
    "metrics": ("RAG_METRICS", "on"),
    "metrics_token": ("RAG_METRICS_TOKEN", ""),
    "trace_queries": ("RAG_TRACE_QUERIES", "off"),
    "log_format": ("RAG_LOG_FORMAT", "text"),
    # issue 50: every sentence of a written answer checked against the source it cites
    "answer_verify": ("RAG_ANSWER_VERIFY", "flag"),
    "verify_llm": ("RAG_VERIFY_LLM", "off"),
}

#: Integer settings and the smallest value each accepts (0 means "off/default" where allowed).
MIN_INT = {
    "chunk_target": 1,
    "embed_batch_size": 1,
    "embed_threads": 0,
    "embed_dims": 0,
    "rerank_depth": 1,
    "expand_n": 1,
    "backfill_batch_rows": 1,
    "embed_concurrency": 1,
    "embed_retries": 0,
    "embed_window": 0,
    "adapt_steps": 0,
    "adapt_max_steps": 1,
}
#: Float settings and their closed range.
FLOAT_RANGE = {
    "recall_floor": (0.0, 1.0),
    "max_bluff_rate": (0.0, 1.0),
    "ocr_min_confidence": (0.0, 1.0),
    "lease_seconds": (0.001, 86_400.0),
    "lease_wait": (0.0, 86_400.0),
    "query_log_days": (0.0, 36_500.0),
    "embed_timeout": (0.1, 3_600.0),
    "embed_probe_interval": (0.0, 86_400.0),
    "rerank_timeout": (0.1, 600.0),
    "source_max_delete_share": (0.0, 1.0),
}


# -- issue 30: every setting range-checked, named in its error ---------------------------------
@dataclass(frozen=True)
class Rule:
    """What one setting's text may be. ``kind``: ``int`` / ``float`` (closed range ``lo``..``hi``,
    finite), ``choice`` (one of ``choices``, case-insensitive; ``""`` only when listed),
    ``cut`` (empty, or a cosine distance 0..2), ``path`` (non-empty), ``text``, ``url`` (empty,
    or http(s)://host...), ``cron`` (five cron fields), ``hosts`` (comma-separated host names),
    ``device`` (auto, cpu, mps, cuda, cuda:N), ``fusion`` (the RAG_FUSION grammar). No value
    may hold control characters. ``secret``: the value is never shown in an error."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    secret: bool = False


def _ints(lo: int, hi: int) -> Rule:
    return Rule("int", lo, hi)


def _floats(lo: float, hi: float) -> Rule:
    return Rule("float", lo, hi)


_LLM_MODES = ("", "llm")
_ON_OFF = ("", "on", "off", "1", "0", "true", "false", "yes", "no")


def is_on(var: str, value: str, *, empty: bool = False) -> bool:
    """An on/off setting's value: ``on``, ``1``, ``true``, ``yes`` or ``off``, ``0``, ``false``,
    ``no`` in any case, ``""`` meaning ``empty``; anything else is refused naming ``var``."""
    text = value.strip().lower()
    if text not in _ON_OFF:
        raise ValueError(f"{var}={value!r}: give on or off")
    return empty if text == "" else text in ("on", "1", "true", "yes")


def adapt_mode(value: str) -> str:
    """``RAG_ADAPT``'s mode (issue 44): ``auto`` (the default, also for ``""``): the graph adapts
    the encoder after the base table is published, when the corpus gives enough pairs and the
    training fits ``RAG_ADAPT_BUDGET_S``; ``on``: always; ``off``: never. Anything else is
    refused naming the variable."""
    if value.strip().lower() in ("", "auto"):
        return "auto"
    return "on" if is_on("RAG_ADAPT", value) else "off"


RULES: dict[str, Rule] = {
    "documents_dir": Rule("path"),
    "index_uri": Rule("path"),
    "work_dir": Rule("text"),  # "" = the index's own (<index>/.rag-work, issue 31)
    "eval_dir": Rule("path"),
    "chunk_strategy": Rule("choice", choices=tuple("ABCDEF")),
    "chunk_target": _ints(MIN_INT["chunk_target"], 100_000),
    "embedding_model": Rule("text"),
    "embed_batch_size": _ints(MIN_INT["embed_batch_size"], 65_536),
    "embed_threads": _ints(MIN_INT["embed_threads"], 4096),
    "rerank_model": Rule("text"),
    "distance_cut": Rule("cut", 0.0, 2.0),
    "eval_budget_s": _floats(0.0, 7 * 86_400.0),
    "recall_floor": _floats(*FLOAT_RANGE["recall_floor"]),
    "max_bluff_rate": _floats(*FLOAT_RANGE["max_bluff_rate"]),
    "failed_policy": Rule("choice", choices=("keep", "drop")),
    "reindex_cron": Rule("cron"),
    "base_url": Rule("url"),
    "llm_url": Rule("url"),
    "llm_model": Rule("text"),
    "llm_api_key": Rule("text", secret=True),
    "embed_dims": _ints(MIN_INT["embed_dims"], 65_536),
    "query_prompt": Rule("text"),
    "document_prompt": Rule("text"),
    "fusion": Rule("fusion"),
    "rerank_depth": _ints(MIN_INT["rerank_depth"], 1000),
    "answer_check": Rule("choice", choices=_LLM_MODES),
    "expand": Rule("choice", choices=_LLM_MODES),
    "expand_llm_url": Rule("url"),
    "expand_llm_model": Rule("text"),
    "expand_n": _ints(MIN_INT["expand_n"], 100),
    "query_rewrite": Rule("choice", choices=_LLM_MODES),
    "api_token": Rule("text", secret=True),
    "token": Rule("text", secret=True),
    "query_encoder": Rule("choice", choices=("", "onnx", "onnx-int8", "torch")),
    "ocr_min_confidence": _floats(*FLOAT_RANGE["ocr_min_confidence"]),
    "force_folder": Rule("choice", choices=("", "0", "1", "true", "false", "yes", "no")),
    "device": Rule("device"),
    "embed_precision": Rule("choice", choices=("fp32", "fp16", "bf16")),
    "backfill_batch_rows": _ints(MIN_INT["backfill_batch_rows"], 100_000_000),
    "lease_seconds": _floats(*FLOAT_RANGE["lease_seconds"]),
    "lease_wait": _floats(*FLOAT_RANGE["lease_wait"]),
    "allowed_hosts": Rule("hosts"),
    "include": Rule("text"),
    "exclude": Rule("text"),
    "body_timeout_s": _floats(0.1, 3600.0),
    "session_ttl_s": _floats(60.0, 30 * 86_400.0),
    # issue 35: model servers
    "embed_url": Rule("url"),
    "embed_model": Rule("text"),
    "embed_api_key": Rule("text", secret=True),
    "embed_concurrency": _ints(MIN_INT["embed_concurrency"], 256),
    "embed_timeout": _floats(*FLOAT_RANGE["embed_timeout"]),
    "embed_retries": _ints(MIN_INT["embed_retries"], 100),
    "embed_window": _ints(MIN_INT["embed_window"], 10_000_000),
    "embed_probe_interval": _floats(*FLOAT_RANGE["embed_probe_interval"]),
    "rerank_url": Rule("url"),
    "rerank_api_key": Rule("text", secret=True),
    "rerank_timeout": _floats(*FLOAT_RANGE["rerank_timeout"]),
    # issue 32: the adapted encoder (RAG_ADAPT_RETRAIN's grammar is checked where it is parsed)
    "adapt": Rule("choice", choices=(*_ON_OFF, "auto")),
    "adapt_budget_s": _floats(0.0, 7 * 86_400.0),
    "adapt_steps": _ints(MIN_INT["adapt_steps"], 1_000_000),
    "adapt_max_steps": _ints(MIN_INT["adapt_max_steps"], 1_000_000),
    "adapt_retrain": Rule("text"),
    # issue 33: the query log
    "query_log": Rule("choice", choices=_ON_OFF),
    "query_log_days": _floats(*FLOAT_RANGE["query_log_days"]),
    "query_log_redact": Rule("choice", choices=_ON_OFF),
    "feedback_per_minute": _ints(0, 100_000),
    # issue 41: sources
    "sources": Rule("text"),
    "source_max_delete_share": _floats(*FLOAT_RANGE["source_max_delete_share"]),
    "source_confirm_delete": Rule("text"),
    "source_presign_seconds": _ints(0, 604_800),  # S3's longest presigned URL: 7 days
    # issue 52: operating the service
    "metrics": Rule("choice", choices=_ON_OFF),
    "metrics_token": Rule("text", secret=True),
    "trace_queries": Rule("choice", choices=_ON_OFF),
    "log_format": Rule("choice", choices=("text", "json")),
    # issue 50: the answer verifier's policy; the model's second opinion (at RAG_LLM_URL)
    "answer_verify": Rule("choice", choices=("flag", "drop", "refuse")),
    "verify_llm": Rule("choice", choices=_ON_OFF),
}
"""One rule per entry of :data:`ENV` (a test keeps the two equal)."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_URL = re.compile(r"^https?://[^\s/?#]+(?:[/?#]\S*)?$", re.IGNORECASE)
_CRON_FIELD = re.compile(
    r"^(\*|\?|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?(,(\*|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?)*$"
)
_HOST = re.compile(
    r"^(\[?[0-9a-f:]+\]?|[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*\.?)$"
)
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:[0-9]+)?)$")
_FUSION_OPTION = re.compile(r"^(dense|bm25)=[0-9]*\.?[0-9]+(e[+-]?[0-9]+)?$|^(k|depth)=[0-9]+$")


def check_value(name: str, raw: str) -> str | None:
    """Why ``raw`` is not a valid value of the setting ``name`` (None when it is); the
    caller names the variable (see :func:`setting_error`)."""
    rule = RULES[name]
    text = raw.strip()
    if _CONTROL.search(raw):
        return "holds a control character (a newline, tab or NUL): give it on one line"
    if rule.kind in ("int", "float", "cut"):
        if rule.kind == "cut" and not text:
            return None
        what = "whole number" if rule.kind == "int" else "number"
        try:
            value = int(text) if rule.kind == "int" else float(text)
        except ValueError:
            return f"not a {what}" + (
                ": give a cosine distance such as 0.675, or leave it empty for the calibrated cut"
                if rule.kind == "cut"
                else ""
            )
        lo, hi = rule.lo, rule.hi
        if (
            not math.isfinite(value)
            or (lo is not None and value < lo)
            or (hi is not None and value > hi)
        ):
            if rule.kind == "cut":
                return "not a cosine distance from 0 to 2 (leave it empty for the calibrated cut)"
            return f"out of range: give a {what} from {lo:g} to {hi:g}"
        return None
    if rule.kind == "choice":
        if text.lower() in {c.lower() for c in rule.choices}:
            return None
        named = [c for c in rule.choices if c] + (["empty (off)"] if "" in rule.choices else [])
        return f"not one of {', '.join(named)}"
    if rule.kind == "path":
        return None if text else "empty: give a path"
    if rule.kind == "url":
        return None if not text or _URL.match(text) else "not an http:// or https:// URL"
    if rule.kind == "cron":
        fields = text.split()
        ok = text.startswith("@") or (
            len(fields) == 5 and all(_CRON_FIELD.match(f) for f in fields)
        )
        return None if ok else "not a cron schedule (five fields, e.g. 0 * * * *)"
    if rule.kind == "hosts":
        bad = [h for h in (p.strip().lower() for p in text.split(",")) if h and not _HOST.match(h)]
        return f"not a host name: {bad[0]!r} (comma-separated names, no ports)" if bad else None
    if rule.kind == "device":
        return (
            None if _DEVICE.match(text.lower() or "auto") else "not auto, cpu, cuda, cuda:N or mps"
        )
    if rule.kind == "fusion":
        method, _, opts = (text.lower() or "rrf").partition(":")
        parts = [p.strip() for p in opts.split(",") if p.strip()]
        if (method in ("dense", "bm25") and not opts) or (
            method == "rrf" and all(_FUSION_OPTION.match(p) for p in parts)
        ):
            return None
        return "use rrf, rrf:dense=2 (options dense=W, bm25=W, k=N, depth=N), dense or bm25"
    return None  # text


def setting_error(name: str, raw: str, why: str) -> str:
    """``RAG_X='value': why`` (a secret's value is never shown)."""
    var = ENV[name][0]
    shown = f"{var} (value hidden)" if RULES[name].secret else f"{var}={raw!r}"
    return f"{shown}: {why}"


@dataclass(frozen=True)
class Settings:
    documents_dir: str = "data/documents"
    index_uri: str = "data/index"
    work_dir: str = ""  # "" = index_work_dir(index_uri), filled in on construction
    chunk_strategy: str = "E"
    chunk_target: int = 512
    embedding_model: str = ""  # "" = packaged all-MiniLM-L6-v2
    embed_batch_size: int = 16
    embed_threads: int = 0  # 0 = torch default
    rerank_model: str = ""  # "" = rerank off
    distance_cut: str = ""  # "" = calibrated cut, else 0.675
    eval_dir: str = "data/eval"
    eval_budget_s: float = 300.0  # RAG_EVAL_BUDGET_S: the rest waits for a later run
    recall_floor: float = 0.5
    max_bluff_rate: float = 0.10
    failed_policy: str = "keep"
    reindex_cron: str = "0 * * * *"
    base_url: str = ""
    llm_url: str = ""
    llm_model: str = ""
    llm_api_key: str = ""  # sent as a bearer token, never logged
    embed_dims: int = 0  # 0 = the model's own dimension; else a Matryoshka truncation
    query_prompt: str = ""  # "" = the model's own "query" prompt, if it has one
    document_prompt: str = ""  # "" = the model's own "document"/"passage" prompt, if any
    fusion: str = "rrf"
    rerank_depth: int = 25  # hybrid top-k the reranker scores
    answer_check: str = ""  # "" = distance gate only; "llm" = distance, then the judge
    expand: str = ""  # "" = off; "llm" = doc2query views written by the model
    expand_llm_url: str = ""  # "" = RAG_LLM_URL
    expand_llm_model: str = ""  # "" = RAG_LLM_MODEL
    expand_n: int = 3  # questions written per chunk
    query_rewrite: str = ""  # "" = off; "llm" = the model rewrites the question
    api_token: str = ""  # "" = no auth on the HTTP service
    token: str = ""  # RAG_TOKEN: `rag-assets mcp` over stdio sees what this token sees
    query_encoder: str = "onnx"  # exact fp32 ONNX query vectors (torch fallback); onnx-int8; torch
    ocr_min_confidence: float = 0.80
    force_folder: str = ""  # "1": a run may replace the folder the index is built from
    lease_seconds: float = 60.0  # writer lease TTL (a kill -9'd holder blocks at most this)
    lease_wait: float = 0.0  # seconds `index` waits for another writer before refusing
    allowed_hosts: str = ""  # comma-separated Host names the service answers besides loopback
    include: str = ""  # comma-separated gitignore-style globs: only matching files are indexed
    exclude: str = ""  # comma-separated gitignore-style globs: matching files are not indexed
    device: str = "auto"  # auto = CUDA when torch sees one, else cpu; cpu, cuda, cuda:N, mps
    embed_precision: str = "fp32"  # fp32, fp16 or bf16 (a half-precision index is a new table)
    backfill_batch_rows: int = 2048  # rag-assets backfill: about this many chunks per batch run
    query_log: str = "on"  # off: no query is recorded (and no feedback is taken)
    query_log_days: float = 90.0  # unreviewed entries older than this are removed; 0 = kept
    query_log_redact: str = "off"  # on: e-mail addresses and 7+ digit runs masked in the log
    feedback_per_minute: int = 30  # verdicts one group token may give a minute (0 = no limit)
    # issue 35: a model server embeds (OpenAI /v1/embeddings) and/or reranks (/rerank)
    embed_url: str = ""  # "" = the local RAG_EMBEDDING_MODEL; else the server's base URL
    embed_model: str = ""  # a model the server lists ("" = its only one)
    embed_api_key: str = ""  # sent as a bearer token, never printed
    embed_concurrency: int = 2  # requests in flight while indexing
    embed_timeout: float = 300.0  # seconds per request (queueing at the server included)
    embed_retries: int = 4  # further tries on 429/5xx/dropped connections, honouring Retry-After
    embed_window: int = 0  # the server's input window in tokens (0 = ask it, else unknown)
    embed_probe_interval: float = 60.0  # the service re-probes the fingerprint (0 = never)
    rerank_url: str = ""  # "" = RAG_RERANK_MODEL decides; else a /rerank server
    rerank_api_key: str = ""  # sent as a bearer token, never printed
    rerank_timeout: float = 5.0  # past this a query keeps the hybrid order (never fails)
    adapt: str = "auto"  # issue 32/44: auto (where it pays), on (always), off: see adapt_mode
    adapt_budget_s: float = 1800.0  # auto: the longest training it starts on a CPU (0 = no bound)
    adapt_steps: int = 0  # training steps; 0 = one epoch of the pairs, at least 100
    adapt_max_steps: int = 500  # the cap on training steps (keeps a large corpus bounded)
    adapt_retrain: str = "changed:0.2"  # when to train again: changed:F, cron:EXPR, never
    body_timeout_s: float = 30.0  # serve: a request body must arrive within this (else 408)
    session_ttl_s: float = 43200.0  # serve: a page login (signed session cookie) lasts this
    sources: str = ""  # RAG_SOURCES: a sources file (TOML), docs/sources.md (issue 41)
    source_max_delete_share: float = 0.5  # more deletions than this share are withheld
    source_confirm_delete: str = ""  # comma-separated source names (or all) allowed more
    source_presign_seconds: int = 0  # issue 49: presigned object links' lifetime (0: none)
    metrics: str = "on"  # serve: GET /metrics and the request/stage series (off: neither)
    metrics_token: str = ""  # serve: a bearer token for GET /metrics only (besides RAG_API_TOKEN)
    trace_queries: str = "off"  # on: traces carry the question (rag.query); never by default
    log_format: str = "text"  # json: one JSON object a line (service and command line)
    answer_verify: str = "flag"  # issue 50: flag | drop | refuse unsupported sentences
    verify_llm: str = "off"  # issue 50: on = also ask the model at RAG_LLM_URL (second opinion)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        values: dict[str, Any] = {}
        types = {f.name: f.type for f in fields(cls)}
        for name, (var, default) in ENV.items():
            raw = env.get(var, default)
            why = check_value(name, raw) if name in RULES else None  # issue 30
            if why:
                raise ValueError(setting_error(name, raw, why))
            kind = types[name]
            try:
                values[name] = (
                    int(raw) if kind == "int" else float(raw) if kind == "float" else str(raw)
                )
            except ValueError:
                raise ValueError(f"{var}={raw!r} is not a valid {kind}: set {var}") from None
            if name in MIN_INT and values[name] < MIN_INT[name]:
                raise ValueError(f"{var}={raw!r}: must be at least {MIN_INT[name]}")
            lo_hi = FLOAT_RANGE.get(name)
            if lo_hi and not lo_hi[0] <= values[name] <= lo_hi[1]:
                raise ValueError(f"{var}={raw!r}: must be between {lo_hi[0]:g} and {lo_hi[1]:g}")
        cut = values["distance_cut"].strip()
        if cut:
            try:
                float(cut)
            except ValueError:
                raise ValueError(
                    f"RAG_DISTANCE_CUT={cut!r} is not a number: give a cosine distance such as "
                    "0.675, or leave it empty for the calibrated cut"
                ) from None
        for name, rule in RULES.items():  # issue 30: a choice is taken in any case
            if rule.kind == "choice" and name != "chunk_strategy" and name in values:
                values[name] = str(values[name]).strip().lower()
        s = cls(**values)
        s = replace(s, chunk_strategy=s.chunk_strategy.strip())
        if s.chunk_strategy.upper() not in "ABCDEF" or len(s.chunk_strategy) != 1:
            raise ValueError(f"RAG_CHUNK_STRATEGY must be one of A-F, not {s.chunk_strategy!r}")
        if s.failed_policy not in ("keep", "drop"):
            raise ValueError(f"RAG_FAILED_POLICY must be keep or drop, not {s.failed_policy!r}")
        return replace(s, chunk_strategy=s.chunk_strategy.upper())

    def __post_init__(self) -> None:
        if not self.work_dir:  # issue 31: the working folder belongs to the index
            object.__setattr__(self, "work_dir", index_work_dir(self.index_uri))

    @property
    def work_dir_given(self) -> bool:
        """Whether ``RAG_WORK_DIR`` (or the caller) named the working folder, rather than it
        being the index's own (:func:`index_work_dir`)."""
        return self.work_dir != index_work_dir(self.index_uri)

    @property
    def shared_work_dir(self) -> str:
        """The working folder of work that belongs to no index (``rag-assets eval``'s indexes,
        ``questions``' model replies): ``RAG_WORK_DIR`` when given, else the per-user
        ``~/.cache/rag-assets/work/shared``, never the current directory."""
        return self.work_dir if self.work_dir_given else str(user_work_root() / "shared")

    def with_index(self, index_uri: str) -> Settings:
        """These settings for another index: its own working folder comes along, unless
        ``RAG_WORK_DIR`` named one (``dataclasses.replace`` would keep the old index's)."""
        work = self.work_dir if self.work_dir_given else ""
        return replace(self, index_uri=index_uri, work_dir=work)

    @property
    def allowed_host_list(self) -> list[str]:
        """``RAG_ALLOWED_HOSTS`` as lower-case names (no ports)."""
        return [h.strip().lower() for h in self.allowed_hosts.split(",") if h.strip()]

    @property
    def verify_second_opinion(self) -> bool:
        """``RAG_VERIFY_LLM`` on (and a model at ``RAG_LLM_URL`` to ask)."""
        return is_on("RAG_VERIFY_LLM", self.verify_llm) and bool(self.llm_url)

    @property
    def cut_override(self) -> float | None:
        return float(self.distance_cut) if self.distance_cut else None


#: The working folder of a local index, inside it (issue 31): extracted text, chunk Parquet, model
#: caches and the Dagster instance of ``rag-assets index`` (``dagster/``) live with the index
WORK_SUBDIR = ".rag-work"


def index_work_dir(index_uri: str) -> str:
    """The working folder of an index when ``RAG_WORK_DIR`` does not name one: ``<index>/
    .rag-work`` for a local index, and for an object-store index (``s3://…``) a local folder per
    user and index, ``~/.cache/rag-assets/work/<first 16 hex of sha256(URI)>``. Never the
    current directory, so a run from anywhere writes nothing where it was started."""
    uri = str(index_uri)
    if "://" in uri:
        key = hashlib.sha256(uri.encode("utf-8")).hexdigest()[:16]
        return str(user_work_root() / key)
    return str(Path(uri).expanduser() / WORK_SUBDIR)


def user_work_root() -> Path:
    """``~/.cache/rag-assets/work``: the per-user place of the working folders that cannot live
    in an index (object-store indexes, work that belongs to no index)."""
    return Path.home() / ".cache" / "rag-assets" / "work"
