"""ONNX Runtime query encoders (fp32, the default, and int8) for the table's own model.

Issue 20: ``RAG_QUERY_ENCODER`` defaults to ``onnx``, the exact fp32 export (rank-identical to
torch on every course-dev query), for the CLI, the service and MCP alike, so a query needs
``tokenizers`` + ``onnxruntime`` (under a second to import) instead of torch and
sentence-transformers (tens of seconds on 2 busy cores). :func:`query_embedder` builds the
query side from the settings: a cached export is used as is; a missing one is exported once
(torch loads that one time) into ``RAG_WORK_DIR``; an export that cannot be made or fails its
check falls back to torch with a one-line warning. ``RAG_QUERY_ENCODER=torch`` keeps torch.

Why: a torch query embedding costs 12–60 ms on the 2 shared cores, which is nearly all of a
``/search`` request. The same weights exported to ONNX and quantised to int8 **per channel**
(``onnxruntime.quantization.quantize_dynamic(per_channel=True)``) embed a query in ≈2.5 ms;
without per-channel scales the cosine to torch drops to ≈0.89, which is unusable (see
``design/toolchain-findings.md``).

Correctness rule. A vector from another encoder is, until shown otherwise, a vector in another
space. This encoder is used **only for queries**, only under ``RAG_QUERY_ENCODER=onnx*``, and
only for the model directory whose content hash (``ModelSpec.revision``) the table is stamped
with: the export is made from that directory's local weights and cached under that hash, so a
changed model is a new export. Before an export is used it is checked against torch on
:data:`PROBES` (plus the model's query prompt): the lowest cosine must reach
:data:`MIN_PROBE_COSINE`, else the export is refused with one line naming the setting. The
result of the check is kept in the export's ``manifest.json``. Documents are always embedded by
torch; what the int8 query side does to rankings is measured by
``python -m rag_assets.bench.speed encoders`` (top-k overlap, recall@4, MRR against torch queries).

No network: the export reads the local directory only; ``onnx`` and ``onnxruntime`` are
packages. The runtime path (cached export → tokenizer.json → ONNX Runtime) needs no torch.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import warnings
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from rag_assets.lib.index.embed import Embedder, ModelSpec
    from rag_assets.lib.index.versioning import Stamps
    from rag_assets.settings import Settings

SETTING = "RAG_QUERY_ENCODER"
TORCH = "torch"
ONNX = "onnx"  # the fp32 export: the same arithmetic as torch, run by ONNX Runtime
ONNX_INT8 = "onnx-int8"  # the fp32 export quantised to int8 (per-channel weights)
QUERY_ENCODERS = (TORCH, ONNX, ONNX_INT8)

EXPORT_VERSION = "1"
"""Bump when the export recipe (graph, opset, quantisation options) changes: a new cache key."""

OPSET = 17
"""ONNX opset of the export (ONNX Runtime 1.32 runs up to 23; 17 has LayerNormalization)."""

MIN_PROBE_COSINE = {ONNX: 0.9999, ONNX_INT8: 0.97}
"""Lowest cosine to the torch query vector, over :data:`PROBES`, an export must reach to be
used. fp32 is the same computation (measured 1.0000 on every probe): anything lower is a broken
export. Per-channel int8 of all-MiniLM-L6-v2 measured 0.990–0.995 on questions and 0.9726 on the
one-word probe "ok" (short inputs lose most); per-tensor int8 measured 0.89 in the toolchain
notes and must be refused."""

PROBES = (
    "How do I roll back to the previous embedding model?",
    "stale assets",
    "Why does my training loss stay flat after the first epoch?",
    "tokenizer adds [CLS] and [SEP] tokens, how do I remove them",
    "What is the difference between fine-tuning and pretraining?",
    "ValueError: expected sequence of length 128 at dim 1 (got 97)",
    "how to push a model to the hub without internet",
    "Which learning rate should I pick for a small dataset?",
    "What is the boiling point of tungsten?",
    "my pipeline returns the wrong label for every sentence, model is distilbert",
    "batch padding collator",
    "Explain attention masks in two sentences.",
    "Can I run inference on a CPU only machine, and how slow will it be compared to a GPU with "
    "the same batch size and sequence length of 512 tokens?",
    "ok",
)
"""Fixed probe queries of varied length and register (short keyword, question, error message,
long ticket) used to check an export against torch; deterministic, stored with the code."""

_LOCK = threading.Lock()


class OnnxEncoderError(RuntimeError):
    """The ONNX query encoder cannot be built or failed its check (one line, names the fix)."""


DEFAULT_QUERY_ENCODER = ONNX
"""``RAG_QUERY_ENCODER`` when unset or "": the fp32 export (same arithmetic as torch, ~20x less
to import), falling back to torch where it cannot be built."""


def parse_query_encoder(value: str | None) -> str:
    """``RAG_QUERY_ENCODER`` → ``onnx`` (default, also for ""), ``onnx-int8`` or ``torch``."""
    v = (value or "").strip().lower() or DEFAULT_QUERY_ENCODER
    if v not in QUERY_ENCODERS:
        raise ValueError(f"{SETTING}={value!r}: use {' or '.join(QUERY_ENCODERS)}")
    return v


def _supported(path: Path) -> None:
    """Only Transformer → Pooling → (Normalize) models are exported (what the graph holds)."""
    modules = json.loads((path / "modules.json").read_text())
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    allowed = {"Transformer", "Pooling", "Normalize"}
    if not kinds or kinds[0] != "Transformer" or not set(kinds) <= allowed:
        raise OnnxEncoderError(
            f"{SETTING}=onnx supports Transformer+Pooling(+Normalize) models; "
            f"{path.name} has {'+'.join(kinds)}: set {SETTING}={TORCH}"
        )


class OnnxQueryEncoder:
    """Query vectors from the int8 export of ``spec``'s model (built once, cached by hash).

    ``encode(texts)`` takes texts *with* the query prompt already prepended (as
    :meth:`Embedder._encode` passes them) and returns L2-normalised float32 vectors, truncated
    to ``spec.dims`` (Matryoshka) and re-normalised like sentence-transformers does.
    """

    def __init__(
        self, spec: ModelSpec, cache_root: str | Path, threads: int = 1, kind: str = ONNX_INT8
    ):
        if kind not in (ONNX, ONNX_INT8):
            raise ValueError(f"{SETTING}: an ONNX query encoder is {ONNX} or {ONNX_INT8}")
        self.spec = spec
        self.cache_root = Path(cache_root)
        self.threads = max(1, int(threads))
        self.kind = kind

    @property
    def cache_dir(self) -> Path:
        """``<cache_root>/onnx-query/<model content hash>-<kind>-e<EXPORT_VERSION>``."""
        name = f"{self.spec.revision}-{self.kind}-e{EXPORT_VERSION}"
        return self.cache_root / "onnx-query" / name

    @property
    def model_file(self) -> Path:
        return self.cache_dir / ("model.int8.onnx" if self.kind == ONNX_INT8 else "model.onnx")

    @property
    def manifest(self) -> dict[str, Any]:
        f = self.cache_dir / "manifest.json"
        return dict(json.loads(f.read_text())) if f.exists() else {}

    @property
    def cached(self) -> bool:
        """Whether a checked export of this model and kind is in :attr:`cache_dir`."""
        try:
            return self.model_file.exists() and self.manifest.get("revision") == self.spec.revision
        except (OSError, ValueError):
            return False

    def ensure(self, reference: Embedder | None = None) -> dict[str, Any]:
        """The export's manifest; export, quantise and check it first when not cached.

        ``reference`` is the torch :class:`Embedder` of the same spec (loaded only when an
        export is needed)."""
        with _LOCK:
            if self.cached:
                return self.manifest
            _supported(self.spec.path)
            from rag_assets.lib.index.embed import Embedder

            ref = reference or Embedder(self.spec, threads=self.threads)
            self.cache_dir.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=self.cache_dir.parent))
            try:
                t = time.perf_counter()
                self._export(ref, tmp)
                export_s = time.perf_counter() - t
                check = _check(self._session(tmp / self.model_file.name), self, ref)
                if check["min_cosine"] < check["floor"]:
                    raise OnnxEncoderError(
                        f"{SETTING}={self.kind}: the export of {self.spec.model_id} reaches "
                        f"cosine {check['min_cosine']:.4f} to torch on the probe queries, below "
                        f"{check['floor']}: set {SETTING}={TORCH}"
                    )
                manifest = _manifest(self.spec, self.kind, export_s, check)
                (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
                if self.cache_dir.exists():  # a stale or half export: replace it whole
                    shutil.rmtree(self.cache_dir)
                tmp.rename(self.cache_dir)  # atomic on one filesystem: never a half cache
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            return manifest

    # -- runtime --------------------------------------------------------------------------
    @cached_property
    def session(self) -> Any:
        if not self.model_file.exists():
            self.ensure()
        return self._session(self.model_file)

    def _session(self, path: Path) -> Any:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    @cached_property
    def tokenizer(self) -> Any:
        from tokenizers import Tokenizer

        f = self.spec.path / "tokenizer.json"
        if not f.exists():
            raise OnnxEncoderError(
                f"{SETTING}={self.kind} needs {f} (a fast tokenizer): set {SETTING}={TORCH}"
            )
        tok = Tokenizer.from_file(str(f))
        tok.no_padding()
        tok.enable_truncation(max_length=self.max_seq_length)
        return tok

    @cached_property
    def max_seq_length(self) -> int:
        """The sentence-transformers window (``sentence_bert_config.json``), else 512."""
        f = self.spec.path / "sentence_bert_config.json"
        cfg = json.loads(f.read_text()) if f.exists() else {}
        return int(cfg.get("max_seq_length") or 512)

    @cached_property
    def _input_names(self) -> list[str]:
        return [i.name for i in self.session.get_inputs()]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """One ONNX run per text (no padding: queries are short, and batch-of-one is fastest)."""
        session = self.session
        names = self._input_names
        out = np.zeros((len(texts), self.spec.native_dims or self.spec.dims), dtype=np.float32)
        for i, text in enumerate(texts):
            enc = self.tokenizer.encode(text)
            feeds = {
                "input_ids": np.asarray([enc.ids], dtype=np.int64),
                "attention_mask": np.asarray([enc.attention_mask], dtype=np.int64),
                "token_type_ids": np.asarray([enc.type_ids], dtype=np.int64),
            }
            out[i] = session.run(None, {n: feeds[n] for n in names})[0][0]
        if self.spec.dims < out.shape[1]:  # Matryoshka: truncate, then re-normalise
            out = out[:, : self.spec.dims]
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.asarray(out / np.maximum(norms, 1e-12), dtype=np.float32)

    # -- export ---------------------------------------------------------------------------
    def _export(self, ref: Embedder, folder: Path) -> None:
        """torch.onnx (TorchScript exporter) of the whole sentence-transformers stack
        (``model.onnx``); for int8, then per-channel dynamic quantisation of its weights."""
        import torch
        from onnxruntime.quantization import QuantType, quantize_dynamic

        model = ref.model
        features = model.preprocess(["a probe query for export"])
        names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in features]

        class Stack(torch.nn.Module):
            def __init__(self, st: Any) -> None:
                super().__init__()
                self.st = st

            def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
                feats = dict(zip(names, tensors, strict=True))
                return self.st(feats)["sentence_embedding"]  # type: ignore[no-any-return]

        fp32 = folder / "model.onnx"
        if self.kind == ONNX_INT8:  # quantise the checked fp32 export when it is cached
            cached = OnnxQueryEncoder(self.spec, self.cache_root, self.threads, ONNX)
            if cached.model_file.exists() and cached.manifest.get("revision") == self.spec.revision:
                shutil.copyfile(cached.model_file, fp32)
        args = tuple(features[n] for n in names)
        axes = {n: {0: "batch", 1: "tokens"} for n in names} | {"embedding": {0: "batch"}}
        stack = Stack(model).eval()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer notes on data-dependent Python branches
            if not fp32.exists():
                torch.onnx.export(
                    stack,
                    args,
                    str(fp32),
                    input_names=names,
                    output_names=["embedding"],
                    dynamic_axes=axes,
                    opset_version=OPSET,
                    dynamo=False,
                )
        if self.kind == ONNX_INT8:
            int8 = folder / "model.int8.onnx"
            quantize_dynamic(fp32, int8, per_channel=True, weight_type=QuantType.QInt8)
            fp32.unlink()  # only the int8 graph is used


def export_roots(settings: Settings) -> list[Path]:
    """Where a query encoder export is looked for, in order: beside the index (``<index>/``
    ``onnx-query/``, for an index shipped with its export; never written by a query), then
    ``RAG_WORK_DIR`` (where a missing export is written, once per model)."""
    roots = [Path(settings.work_dir)]
    if "://" not in settings.index_uri:
        roots.insert(0, Path(settings.index_uri))
    return roots


def query_embedder(
    settings: Settings,
    *,
    threads: int | None = None,
    warn: Callable[[str], None] | None = None,
    spec: ModelSpec | None = None,
) -> tuple[Embedder, str]:
    """The :class:`Embedder` queries use under ``settings`` and the encoder in effect.

    ``RAG_QUERY_ENCODER=onnx`` (default) / ``onnx-int8``: the cached export of the configured
    model, exported and checked first when there is none (torch loads for that once); torch is
    not loaded otherwise. An export that cannot be built (no ``onnxruntime``, an unsupported
    model, a failed check, an unwritable ``RAG_WORK_DIR``) falls back to torch, saying so once
    through ``warn``. ``threads``: intra-op threads of the ONNX session (default
    ``RAG_EMBED_THREADS`` or 1: one short query gains nothing from more) and of torch.
    ``spec``: the model to embed with; default the configured one, or the adapted model of the
    published table when it was adapted from it (issue 32: exported once per adapted model).
    """
    from rag_assets.lib.index.adapted import query_spec
    from rag_assets.lib.index.embed import Embedder, configured_model
    from rag_assets.lib.index.endpoint import ENCODER, EndpointConfig, query_endpoint

    endpoint = EndpointConfig.from_settings(settings)
    if endpoint is not None:  # issue 35: the model server at RAG_EMBED_URL embeds queries too
        return query_endpoint(settings, endpoint), ENCODER
    kind = parse_query_encoder(settings.query_encoder)
    if spec is None:
        spec = query_spec(settings.index_uri, configured_model(settings), settings.work_dir)
    n = threads or settings.embed_threads or 1
    embedder = Embedder(spec, threads=n, device=settings.device)
    if kind == TORCH:
        return embedder, TORCH
    if spec.precision != "fp32":  # the export is fp32: a half-precision table keeps torch
        if warn is not None:
            warn(f"{SETTING}={kind} is fp32; a {spec.precision} index embeds queries by torch")
        return embedder, TORCH
    try:
        roots = export_roots(settings)
        found = [OnnxQueryEncoder(spec, r, n, kind) for r in roots]
        enc = next((e for e in found if e.cached), found[-1])
        enc.ensure(embedder)  # no-op when cached; else export + check (torch, once per model)
        _ = enc.session
    except (OnnxEncoderError, ImportError, OSError) as e:
        if warn is not None:
            warn(f"{SETTING}={kind} unavailable ({_one_line(e)}): queries are embedded by torch")
        return embedder, TORCH
    embedder.query_encoder = enc
    return embedder, kind


def follow_published(
    settings: Settings,
    *,
    threads: int | None = None,
    warn: Callable[[str], None] | None = None,
) -> Callable[[Stamps], Embedder | None]:
    """For a long-running query side (:class:`rag_assets.lib.query.retrieve.PublishedIndex`):
    the query embedder of a newly published table's stamps. A table of an adapted model of the
    configured one (issue 32) gets that model, exported once; any other table the configured
    model (whose stamp check then names a real mismatch)."""
    from rag_assets.lib.index.adapted import spec_for
    from rag_assets.lib.index.embed import configured_model
    from rag_assets.lib.index.store import IndexStore

    def embedder_for(stamps: Stamps) -> Embedder | None:
        base = configured_model(settings)
        store = IndexStore(settings.index_uri)
        spec = spec_for(stamps, base, store, settings.work_dir) or base
        return query_embedder(settings, threads=threads, warn=warn, spec=spec)[0]

    return embedder_for


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _check(session: Any, enc: OnnxQueryEncoder, ref: Embedder) -> dict[str, Any]:
    """Cosine of the export's query vectors to torch's on :data:`PROBES` (prompt prepended)."""
    probe = OnnxQueryEncoder(enc.spec, enc.cache_root, enc.threads, enc.kind)
    probe.__dict__["session"] = session
    prompt = enc.spec.query_prompt
    ours = probe.encode([prompt + p for p in PROBES])
    theirs = ref._encode(list(PROBES), prompt)  # torch, whatever query encoder ref has
    cos = np.sum(ours * theirs, axis=1)
    return {
        "probes": len(PROBES),
        "min_cosine": round(float(cos.min()), 5),
        "mean_cosine": round(float(cos.mean()), 5),
        "floor": MIN_PROBE_COSINE[enc.kind],
        "per_probe": [round(float(c), 5) for c in cos],
    }


def _manifest(spec: ModelSpec, kind: str, export_s: float, check: dict[str, Any]) -> dict[str, Any]:
    import onnx
    import onnxruntime
    import torch

    return {
        "model": spec.model_id,
        "revision": spec.revision,  # the content hash of the directory the export came from
        "source": str(spec.path),
        "query_prompt": spec.query_prompt,
        "dims": spec.dims,
        "encoder": kind,
        "export_version": EXPORT_VERSION,
        "opset": OPSET,
        "quantization": (
            "dynamic int8, per-channel weights (onnxruntime.quantization)"
            if kind == ONNX_INT8
            else "none (fp32)"
        ),
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "export_s": round(export_s, 2),
        "check": check,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
