"""Embeddings from a model server (issue 35), against a real local HTTP server that speaks the
OpenAI protocol (``rag_assets_tests/model_servers.py``: deterministic vectors, scripted 429 /
500 / slow answers): batching, requests in flight, retries honouring Retry-After, timeouts, one
line for a server that is down, refuses the key or returns the wrong size, inputs over the
window, the prompts, and the fingerprint's tolerance and registry. The real model behind a real
llama.cpp server is in ``test_endpoint_llama.py``."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rag_assets.lib.index.endpoint import (
    EndpointConfig,
    EndpointError,
    configured_embedder,
    connect,
)
from rag_assets.lib.index.fingerprint import (
    FINGERPRINT_MIN_COSINE,
    PROBES,
    REGISTRY_NAME,
    Fingerprint,
    read_registry,
    record,
    resolve,
)
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.models.http import HttpError, backoff_s, retry_after_seconds
from rag_assets.settings import Settings
from rag_assets_tests.model_servers import (
    EmbeddingServer,
    bag_vector,
    direct_to_local_servers,  # noqa: F401 (autouse)
)

KEY = "sk-embed-0123456789abcdef"


@pytest.fixture
def server():
    with EmbeddingServer(model="fake-embed", dims=32) as srv:
        yield srv


def _config(srv: EmbeddingServer, **kw) -> EndpointConfig:
    return replace(EndpointConfig(url=srv.url + "/v1"), **kw)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def _embed_posts(srv: EmbeddingServer) -> list[dict]:
    return srv.posts("/v1/embeddings")


def test_batches_keep_input_order_and_bound_requests_in_flight(server):
    server.overlap = 2  # each request is held until another is in flight too (at most 5 s)
    texts = [f"text number {i} about topic {i % 3}" for i in range(22)]
    emb = connect(_config(server, batch_size=4, concurrency=2))
    first = len(_embed_posts(server))  # the probe
    vecs = emb.encode(texts)
    posts = _embed_posts(server)[first:]
    assert sorted(len(p["body"]["input"]) for p in posts) == [2, 4, 4, 4, 4, 4]
    assert server.max_in_flight == 2  # never more than RAG_EMBED_CONCURRENCY at once
    # the server answers data[] reversed: vectors follow "index", normalised here
    want = np.stack([_unit(bag_vector(t, server.seed, 32)) for t in texts])
    assert np.allclose(vecs, want, atol=1e-6)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-6)


def test_429_is_retried_after_what_retry_after_asks(server):
    emb = connect(_config(server, retries=2))
    before = len(_embed_posts(server))
    server.fail.append(("429", 1.0))
    emb.encode(["a text"])
    a, b = _embed_posts(server)[before:]
    assert b["t"] - a["t"] >= 1.0  # waited what the server asked (a lower bound, not a timing)
    assert emb.client.log.retries == {"429": 1} and emb.client.log.waited_s == 1.0


def test_500_is_retried_with_backoff_and_gives_up_in_one_line(server):
    emb = connect(_config(server, retries=2))
    server.fail.extend([("500", 0)])
    assert emb.encode(["once"]).shape == (1, 32)  # the second try succeeded
    assert emb.client.log.retries == {"500": 1}
    server.fail.extend([("500", 0)] * 3)
    with pytest.raises(EndpointError) as err:
        emb.encode(["never"])
    msg = str(err.value)
    assert "HTTP 500" in msg and "after 3 tries" in msg and "RAG_EMBED_RETRIES" in msg
    assert "\n" not in msg


def test_a_slow_answer_times_out_in_one_line_and_is_not_sent_again(server):
    emb = connect(_config(server, timeout=0.5, retries=3))
    before = len(_embed_posts(server))
    server.fail.append(("slow", 1.5))
    with pytest.raises(EndpointError) as err:
        emb.encode(["too slow"])
    msg = str(err.value)
    assert "did not answer within 0.5 s" in msg and "RAG_EMBED_TIMEOUT" in msg
    assert "RAG_EMBED_CONCURRENCY" in msg and "tries" not in msg
    assert len(_embed_posts(server)) == before + 1  # the slow server got no second copy
    assert emb.client.log.retries == {}
    assert emb.encode(["then fast again"]).shape == (1, 32)


def test_backoff_and_retry_after_parsing():
    assert retry_after_seconds("3") == 3.0 and retry_after_seconds(None) is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_seconds("soon") is None
    assert backoff_s(0, 2.5) == 2.5 and backoff_s(5, 1000) == 60.0  # capped
    assert 0.25 <= backoff_s(0, None) <= 0.5 and 4.0 <= backoff_s(10, None) <= 8.0
    assert HttpError("x", "http", 503).transient and not HttpError("x", "http", 400).transient


def test_a_server_that_is_down_fails_in_one_line_naming_the_setting():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(EndpointError) as err:
        connect(EndpointConfig(url=f"http://127.0.0.1:{port}/v1", retries=3))
    msg = str(err.value)
    assert msg.startswith(f"cannot reach RAG_EMBED_URL=http://127.0.0.1:{port}/v1")
    assert "start the embedding server, or fix RAG_EMBED_URL" in msg and "tries" not in msg


def test_a_refused_key_fails_in_one_line_and_is_never_printed():
    with EmbeddingServer(api_key=KEY) as srv:
        assert connect(_config(srv, api_key=KEY)).dims == 64
        assert srv.requests[-1]["auth"] == f"Bearer {KEY}"  # sent as a bearer token
        with pytest.raises(EndpointError, match=r"HTTP 401.*set RAG_EMBED_API_KEY") as wrong:
            connect(_config(srv, api_key="sk-wrong-key-9876543210"))
        with pytest.raises(EndpointError, match=r"it sent no key: set RAG_EMBED_API_KEY") as none:
            connect(_config(srv))
        url = srv.url.replace("http://", "http://user:pa55w0rd-secret@") + "/v1"
        with pytest.raises(EndpointError) as basic:
            connect(EndpointConfig(url=url, api_key="sk-wrong-key-9876543210"))
    for e in (wrong, none, basic):
        text = str(e.value)
        assert KEY not in text and "sk-wrong-key" not in text and "pa55w0rd" not in text
    assert "***@127.0.0.1" in str(basic.value)


def test_the_model_must_be_one_the_server_lists(server):
    with pytest.raises(EndpointError, match=r"RAG_EMBED_MODEL='other' is not served .*fake-embed"):
        connect(_config(server, model="other"))
    server.models = ["a-model", "b-model"]
    with pytest.raises(
        EndpointError, match=r"serves 2 models \(a-model, b-model\).*RAG_EMBED_MODEL"
    ):
        connect(_config(server))
    server.model = "b-model"
    assert connect(_config(server, model="b-model")).spec.model_id == "b-model"


def test_wrong_dimensions_fail_before_anything_is_written(server, tmp_path):
    with pytest.raises(EndpointError, match=r"RAG_EMBED_DIMS=64 is not possible .*32 dims"):
        connect(_config(server, dims=64))
    emb = connect(_config(server, dims=16))  # Matryoshka: truncated, then normalised
    v = emb.encode(["truncated"])
    assert v.shape == (1, 16) and np.isclose(np.linalg.norm(v), 1.0)
    assert emb.stamps("p", "e").dims == 16
    server.dims = 48  # the server changed size under the same name, mid-run
    with pytest.raises(EndpointError, match=r"returned 48-dim vectors, but its probe gave 32"):
        emb.encode(["resized"])


def test_an_input_over_the_window_is_named(server):
    emb = connect(_config(server, batch_size=8, retries=3))
    server.max_chars = 40  # after the probe (its texts are longer)
    texts = ["short one", "another short", "x" * 30 + " a text far longer than the window allows"]
    with pytest.raises(EndpointError) as err:
        emb.encode(texts)
    msg = str(err.value)
    assert f"refused an input as longer than its window ({len(texts[2])} characters" in msg
    assert "xxxxxxxx" in msg and "RAG_CHUNK_TARGET" in msg and "--ubatch-size" in msg
    assert "tries" not in msg and emb.client.log.retries == {}  # a refusal is not retried


def test_the_window_report_counts_tokens_at_the_server(server):
    from rag_assets.lib.index.embed import window_report
    from rag_assets.lib.types import Chunk

    def chunk(i: int, text: str) -> Chunk:
        return Chunk(f"c{i}", "doc.md", "S", 0, len(text), text, text, 0)

    chunks = [chunk(0, "two words"), chunk(1, "one two three four five six seven")]
    unknown = window_report(connect(_config(server)), chunks)
    assert unknown["over"] == 0 and "window unknown: set RAG_EMBED_WINDOW" in unknown["note"]
    # the fake counts one token per word + [CLS]/[SEP]; the document prompt takes its share
    rep = window_report(connect(_config(server, window=8, document_prompt="none")), chunks)
    assert rep["window"] == 8 and rep["over"] == 1 and "c1" in rep["worst_md"]
    assert 0 < rep["dropped_chars"] < len(chunks[1].text)
    server.tokenize = False
    blind = window_report(connect(_config(server, window=8)), chunks)
    assert blind["over"] == 0 and "no tokenize route" in blind["note"]


def test_prompts_known_for_the_model_family_are_sent_and_stamped():
    with EmbeddingServer(model="nomic-embed-text-v1.5") as srv:
        emb = connect(_config(srv))
        assert (emb.spec.query_prompt, emb.spec.document_prompt) == (
            "search_query: ",
            "search_document: ",
        )
        emb.encode(["a passage"])
        emb.encode_query("a question")
        sent = [p["body"]["input"] for p in srv.posts("/v1/embeddings")]
        assert sent[0] == list(PROBES)  # the probe goes as it is
        assert sent[1:] == [["search_document: a passage"], ["search_query: a question"]]
        plain = connect(_config(srv, query_prompt="none", document_prompt="passage: "))
        st = plain.stamps("p", "e")
        assert (st.query_prompt, st.document_prompt) == ("", "passage: ")
        assert st.table_name != emb.stamps("p", "e").table_name  # another prompt, another table


def test_fingerprints_match_within_the_stated_tolerance():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((len(PROBES), 32)).astype(np.float32)
    a = Fingerprint.of("m", base)
    noisy = Fingerprint.of("m", base + 1e-5 * rng.standard_normal(base.shape).astype(np.float32))
    other = Fingerprint.of("m", base + 0.3 * rng.standard_normal(base.shape).astype(np.float32))
    assert noisy.matches(a) and noisy.min_cosine(a) >= FINGERPRINT_MIN_COSINE
    assert not other.matches(a) and other.id != a.id
    assert not Fingerprint.of("renamed", base).matches(a)  # the name is part of it
    assert resolve(noisy, [other, a]).id == a.id  # a recorded fingerprint keeps its id
    assert resolve(other, [a]) is other  # a new one is itself
    assert Fingerprint.of("m", base).id == a.id  # ids derive from content


def test_the_registry_lives_in_the_index_and_the_work_dir(server, tmp_path):
    store = IndexStore(tmp_path / "index")
    work = tmp_path / "work"
    emb = connect(_config(server), store=store, work_dir=work, record_work=True)
    assert [f.id for f in read_registry(None, work)] == [emb.spec.revision]
    assert store.read_text(REGISTRY_NAME) is None  # the index is written only with rows
    emb.register(store)
    (rec,) = read_registry(store)
    assert rec.id == emb.spec.revision and rec.model == "fake-embed" and rec.dims == 32
    assert np.allclose(rec.vectors, emb.probe.vectors, atol=1e-6)
    record(rec, store, work)  # idempotent
    assert len(read_registry(store, work)) == 1
    server.seed = 2  # another model under the same name
    swapped = connect(_config(server), store=store, work_dir=work, max_age=0)
    assert swapped.spec.revision != emb.spec.revision
    assert len(read_registry(store, work)) == 1  # the query side records nothing


def test_settings_choose_the_server_and_refuse_two_models(server, tmp_path):
    s = replace(Settings(), embed_url=server.url + "/v1", work_dir=str(tmp_path))
    emb = configured_embedder(s)
    assert emb.device == "endpoint" and emb.spec.revision.startswith("fp-")
    with pytest.raises(ValueError, match="RAG_EMBEDDING_MODEL=.* and RAG_EMBED_URL are both set"):
        EndpointConfig.from_settings(replace(s, embedding_model="models/x"))
    with pytest.raises(ValueError, match="RAG_EMBED_PRECISION='fp16' applies to a local model"):
        EndpointConfig.from_settings(replace(s, embed_precision="fp16"))
    env = {"RAG_EMBED_URL": "http://h/v1", "RAG_EMBED_CONCURRENCY": "0"}
    with pytest.raises(
        ValueError, match="RAG_EMBED_CONCURRENCY='0': out of range: give a whole number from 1 to"
    ):
        Settings.from_env(env)


def test_the_api_key_never_enters_the_dagster_resource_config(server, tmp_path):
    from rag_assets.defs.build import build_definitions

    s = replace(
        Settings(),
        embed_url=server.url + "/v1",
        embed_api_key=KEY,
        rerank_url="http://127.0.0.1:9/",
        rerank_api_key=KEY + "-rerank",
        index_uri=str(tmp_path / "index"),
        work_dir=str(tmp_path / "work"),
    )
    server.api_key = KEY
    defs = build_definitions(s)
    shown = repr(defs.resources["embedding_model"]) + repr(defs.resources["rerank_model"])
    assert KEY not in shown and "secret:" in shown
    assert defs.resources["embedding_model"].embedder().spec.model_id == "fake-embed"


def test_probe_vectors_are_unit_and_the_registry_file_is_readable(server, tmp_path):
    emb = connect(_config(server))
    assert emb.probe.vectors.shape == (len(PROBES), 32)
    assert np.allclose(np.linalg.norm(emb.probe.vectors, axis=1), 1.0, atol=1e-6)
    store = IndexStore(tmp_path / "i")
    emb.register(store)
    text = (Path(store.uri) / REGISTRY_NAME).read_text()
    assert '"probe_version": "1"' in text and "cosine >= 0.9999" in text


def test_the_registry_travels_with_the_index_also_on_object_storage(server, index_uri):
    """Issue 23's two variants: a local directory and a prefix of a real S3 server."""
    emb = connect(_config(server), store=IndexStore(index_uri))
    emb.register(emb.store)
    elsewhere = IndexStore(index_uri)  # another process, another machine: only the index
    (rec,) = read_registry(elsewhere)
    assert rec.id == emb.spec.revision and np.allclose(rec.vectors, emb.probe.vectors, atol=1e-6)
    assert connect(_config(server), store=elsewhere, max_age=0).spec.revision == rec.id


def test_a_table_published_after_a_swap_is_served_at_once(server, tmp_path, monkeypatch):
    """The service's holder follows a publish made with the newly served model without waiting
    for its periodic probe: a table the last probe does not match makes it probe again."""
    from rag_assets.lib.index import endpoint
    from rag_assets.lib.index.endpoint import EndpointChanged
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets.lib.query.retrieve import PublishedIndex

    monkeypatch.setattr(endpoint, "RECHECK_S", 0.0)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Tea\n\nGreen tea wants water at eighty degrees.\n")
    (docs / "b.md").write_text("# Bikes\n\nOil every link of the chain.\n")
    uri = tmp_path / "index"
    served = connect(_config(server))
    old = index_folder(docs, uri, strategy("E"), served).entry  # records its fingerprint
    holder = PublishedIndex(uri, embedder=served)
    assert holder.current().search("green tea", "dense", k=1)[0].document_id == "a.md"
    server.seed = 2  # swapped; the holder has not probed since
    new = index_folder(docs, uri, strategy("E"), connect(_config(server))).entry
    assert new.table != old.table
    hits = holder.current().search("green tea", "dense", k=1)  # opens the new table at once
    assert hits[0].stamps["table"] == new.table and holder.last_error is None
    assert served.spec.revision == new.stamps.revision and served.changes == 1
    server.seed = 1  # the old model back, the new table still published
    assert served.reprobe()  # what the service's periodic probe does: then refused
    with pytest.raises(EndpointChanged, match="refused rather than mixed"):
        holder.current().search("green tea", "dense", k=1)


class _ReplyAs:
    """Issue 43: the embeddings server's replies rewritten as a faulty server sends them."""

    def __init__(self, srv: EmbeddingServer, mode: str):
        from rag_assets_tests.model_servers import _EmbedHandler

        def send(handler, code, payload, headers=None):  # noqa: ANN001
            if isinstance(payload, dict) and isinstance(payload.get("data"), list):
                rows = [dict(r) for r in payload["data"]]  # reversed by the server already
                if mode == "no-index":
                    rows = [{k: v for k, v in r.items() if k != "index"} for r in rows]
                elif mode == "duplicate":
                    rows = [r | {"index": 0} for r in rows]
                elif mode == "unequal" and len(rows) > 1:
                    rows[0]["embedding"] = rows[0]["embedding"][:-1]
                elif mode == "in-order":  # no index, in input order: trusted once checked
                    rows = [{k: v for k, v in r.items() if k != "index"} for r in rows[::-1]]
                payload = {**payload, "data": rows}
            _EmbedHandler._send(handler, code, payload, headers)

        srv.httpd.RequestHandlerClass = type("Faulty", (_EmbedHandler,), {"_send": send})


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("no-index", r"without data\[\]\.index and not in the order of the inputs"),
        ("duplicate", r"returned data\[\]\.index \[0, 0, 0.*each of 0\.\.5 must appear once"),
        ("unequal", r"vectors of unequal size \(31 to 32 numbers\)"),
    ],
)
def test_vectors_never_land_on_the_wrong_chunks(server, tmp_path, mode, why):
    """Issue 43: data[] reversed without index fields, duplicate indices or vectors of unequal
    size fail the batch with one line; nothing is published."""
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy

    _ReplyAs(server, mode)
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("a", "b", "c"):
        (docs / f"{name}.md").write_text(f"# {name}\n\nThe {name} topic is about {name * 3}.\n")
    with pytest.raises(EndpointError, match=why):
        index_folder(docs, tmp_path / "index", strategy("E"), connect(_config(server)))
    assert not (tmp_path / "index").exists() or not IndexStore(tmp_path / "index").published()


def test_replies_without_index_in_input_order_are_trusted_once_checked(server):
    _ReplyAs(server, "in-order")
    texts = [f"text number {i}" for i in range(5)]
    vecs = connect(_config(server)).encode(texts)
    want = np.stack([_unit(bag_vector(t, server.seed, 32)) for t in texts])
    assert np.allclose(vecs, want, atol=1e-6)
