"""API tokens kept with the index (issue 34): only hashes are stored, each change is an event
that is never rewritten, a revoke is seen by the very next read; on a local index and on the
real S3 server alike."""

from __future__ import annotations

import hashlib

import pytest

from rag_assets.lib.index.store import IndexStore, TokenError
from rag_assets.lib.index.store.tokens import TOKENS_DIR


def test_add_list_revoke_keep_only_hashes(index_uri):
    store = IndexStore(index_uri)
    assert store.tokens() == [] and store.token_state().find("anything") is None
    alice = store.add_token("alice", ["hr", "legal", "hr"])
    bob = store.add_token("bob", [])
    assert alice.startswith("rag_") and len(alice) > 40 and alice != bob
    found = store.token_state().find(alice)
    assert found is not None and found.name == "alice" and found.groups == ("hr", "legal")
    assert found.hash == hashlib.sha256(alice.encode()).hexdigest()
    # nothing kept with the index holds the token itself
    names = store.file_names(TOKENS_DIR)
    assert len(names) == 2
    stored = b"".join(store.read_file(n) or b"" for n in names)
    assert alice.encode() not in stored and bob.encode() not in stored
    with pytest.raises(TokenError, match="exists: revoke it first"):
        store.add_token("alice", ["x"])
    # another process (another IndexStore) revokes: this one sees it on its next read
    IndexStore(index_uri).revoke_token("alice")
    assert store.token_state().find(alice) is None
    assert store.token_state().find(bob) is not None
    again = store.add_token("alice", ["hr"])  # a new token under the same name
    assert store.token_state().find(again) is not None and store.token_state().find(alice) is None
    listed = [(r.name, r.groups, bool(r.revoked)) for r in store.tokens()]
    assert listed == [
        ("alice", ("hr", "legal"), True),
        ("bob", (), False),
        ("alice", ("hr",), False),
    ]
    with pytest.raises(TokenError, match="no active token named 'carol'"):
        store.revoke_token("carol")


@pytest.mark.parametrize("name", ["", "bad name", "-x", "a/b", "x" * 80])
def test_names_and_groups_are_checked(tmp_path, name):
    store = IndexStore(tmp_path / "index")
    with pytest.raises(TokenError, match="is not a valid token name"):
        store.add_token(name, [])
    with pytest.raises(TokenError, match="is not a valid group name"):
        store.add_token("ok", [name or "a b"])


def test_a_torn_event_is_no_event(tmp_path):
    store = IndexStore(tmp_path / "index")
    token = store.add_token("alice", ["hr"])
    store.write_file(f"{TOKENS_DIR}/00000000000000000001-torn.json", b'{"action": "rev')
    assert store.token_state().find(token) is not None
    store.revoke_token("alice")
    assert IndexStore(tmp_path / "index").token_state().find(token) is None
