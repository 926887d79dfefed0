"""The command layer: one module per group of ``rag-assets`` verbs, each registering its own
subcommands and flags (``register(subparsers)``) and the ``cmd_*`` functions they run.
:mod:`rag_assets.cli` builds the parser from the modules named here and dispatches.

Nothing below this layer (``lib``, ``defs``, ``serve``) imports from it (rag_assets_tests/
test_layers.py). A new verb is a new module here, named in :data:`COMMAND_MODULES`.
"""

#: the verb modules, in the order ``rag-assets --help`` lists their commands
COMMAND_MODULES = (
    "index",
    "query",
    "verify",
    "status",
    "evaluate",
    "bench",
    "serve",
    "token",
    "traffic",
)
