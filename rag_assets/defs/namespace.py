"""One index among several in a code location (issue 51): its assets, checks and resources under
a name of its own.

:func:`rag_assets.defs.build.build_definitions` makes the graph of one index with plain keys
(``chunks``, ``published_index``) and plain resource keys (``documents``, ``lance_index``), as
the CLI's code location (``rag_assets.definitions``) has always had them. Two such graphs cannot
share a code location: their asset keys, op names and resource keys collide, and Dagster refuses
"conflicting versions of resource with key 'documents'" (each job is built over every asset that
shares a key). :func:`namespaced` rewrites one index's definitions so that they can:

- every asset key (and every dependency and check key) gets the prefix ``NAME/``;
- every op is named ``NAME__op`` (Dagster's own name for an asset op with a key prefix);
- every resource key of the index (and the IO manager key of its artefacts) becomes
  ``NAME__key``: each op's compute function is given a signature whose resource parameters carry
  the new names (Dagster passes resources by parameter name), and calls the asset's own function
  with the names it was written with, so no asset is written twice;
- every asset is in the group ``NAME`` (one box per index in the UI's lineage).

The jobs and sensors are made for the prefixed keys by ``build_definitions(…, name=NAME)``
itself (:func:`qualified`, :func:`key`). This rewriting uses Dagster's internal constructors
(``OpDefinition.dagster_internal_init``, ``AssetsDefinition.dagster_internal_init``); the
project pins Dagster's version, and ``rag_assets_tests/test_component.py`` builds, materialises
and queries two indexes in one location through it.
(No ``from __future__ import annotations`` here: Dagster reads the annotations it rewrites.)
"""

import functools
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, get_type_hints

import dagster as dg

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def check_name(name: str) -> str:
    """``name`` when it can prefix asset keys and name jobs, ops and resources (a letter, then
    letters, digits or ``_``), else a ValueError that says so."""
    if not NAME.match(name):
        raise ValueError(
            f"index name {name!r}: use a letter, then letters, digits or _ (it prefixes the "
            "index's asset keys and names its jobs and sensors); rename its defs folder"
        )
    return name


def qualified(name: str, what: str) -> str:
    """A job, sensor or partitions name of the index ``name`` ("" = the CLI's single index)."""
    return f"{name}__{what}" if name else what


def key(name: str, asset: str) -> dg.AssetKey:
    """The key of ``asset`` in the index ``name`` ("" = the CLI's single index)."""
    return dg.AssetKey([name, asset]) if name else dg.AssetKey(asset)


def namespaced(defs: dg.Definitions, name: str) -> dg.Definitions:
    """``defs`` (one index's, from ``build_definitions(settings, name=name)``) with its assets,
    checks, resources and IO managers under ``name`` (see the module docstring)."""
    resources = dict(defs.resources or {})
    renamed = {k: qualified(name, k) for k in resources}
    objects = [*(defs.assets or []), *(defs.asset_checks or [])]
    keys = {k for obj in objects for k in _keys(obj)}
    replacements = {k: dg.AssetKey([name, *k.path]) for k in keys}
    assets: list[Any] = []
    checks: list[Any] = []
    for obj in objects:
        out = _rewrite(obj, name, replacements, renamed)
        (checks if isinstance(out, dg.AssetChecksDefinition) else assets).append(out)
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=defs.jobs,
        sensors=defs.sensors,
        schedules=defs.schedules,
        resources={renamed[k]: v for k, v in resources.items()},
        executor=defs.executor,
        metadata=defs.metadata,
    )


def _keys(obj: Any) -> set[dg.AssetKey]:
    if isinstance(obj, dg.SourceAsset):
        return {obj.key}
    if isinstance(obj, dg.AssetsDefinition):
        deps = {d for spec in obj.specs for d in (dep.asset_key for dep in spec.deps)}
        return (
            set(obj.keys)
            | set(obj.keys_by_input_name.values())
            | deps
            | {c.asset_key for c in obj.check_keys}
        )
    return set()


def _rewrite(
    obj: Any, name: str, replacements: Mapping[dg.AssetKey, dg.AssetKey], resources: dict[str, str]
) -> Any:
    from dagster._core.definitions.module_loaders.utils import replace_keys_in_asset

    if isinstance(obj, dg.SourceAsset):
        return _source_asset(obj, name, replacements, resources)
    moved = replace_keys_in_asset(obj, replacements)
    assert isinstance(moved, dg.AssetsDefinition)
    op = moved.node_def
    new_op = _op(op, f"{name}__{op.name}", resources)
    attrs = moved.get_attributes_dict()
    out = dg.AssetsDefinition.dagster_internal_init(**{**attrs, "node_def": new_op})
    if out.keys:  # checks-only definitions have no asset specs to regroup
        out = out.map_asset_specs(lambda spec: spec.replace_attributes(group_name=name))
    if isinstance(obj, dg.AssetChecksDefinition) or not out.keys:
        return out.coerce_to_checks_def()
    return out


def _op(op: Any, op_name: str, resources: dict[str, str]) -> Any:
    from dagster._core.definitions.decorators.op_decorator import DecoratedOpFunction
    from dagster._core.definitions.op_definition import OpDefinition

    fn = op.compute_fn.decorated_fn
    ins = {
        i.name: dg.In(
            dagster_type=i.dagster_type,
            description=i.description,
            metadata=i.metadata,
            input_manager_key=resources.get(i.input_manager_key or "", i.input_manager_key),
            **({"default_value": i.default_value} if i.has_default_value else {}),
        )
        for i in op.input_defs
    }
    outs = {
        o.name: (dg.DynamicOut if o.is_dynamic else dg.Out)(
            dagster_type=o.dagster_type,
            description=o.description,
            is_required=o.is_required,
            io_manager_key=resources.get(o.io_manager_key, o.io_manager_key),
            metadata=o.metadata,
            code_version=o.code_version,
        )
        for o in op.output_defs
    }
    return OpDefinition.dagster_internal_init(
        compute_fn=DecoratedOpFunction(renamed_parameters(fn, resources)),
        name=op_name,
        ins=ins,
        outs=outs,
        description=op.description,
        config_schema=op.config_schema,
        required_resource_keys={resources.get(k, k) for k in op.required_resource_keys},
        tags=op.tags,
        version=None,
        retry_policy=op.retry_policy,
        code_version=op.version,
        pool=op.pool,
    )


def _source_asset(
    obj: dg.SourceAsset,
    name: str,
    replacements: Mapping[dg.AssetKey, dg.AssetKey],
    resources: dict[str, str],
) -> dg.SourceAsset:
    observe = obj.observe_fn
    return dg.SourceAsset.dagster_internal_init(
        key=replacements.get(obj.key, obj.key),
        metadata=obj.raw_metadata,
        io_manager_key=obj.io_manager_key,
        io_manager_def=obj.io_manager_def,
        description=obj.description,
        partitions_def=obj.partitions_def,
        group_name=name,
        resource_defs=obj.resource_defs,
        observe_fn=renamed_parameters(observe, resources) if observe is not None else None,
        auto_observe_interval_minutes=obj.auto_observe_interval_minutes,
        tags=obj.tags,
        legacy_freshness_policy=obj.legacy_freshness_policy,
        op_tags=obj.op_tags,
        automation_condition=obj.automation_condition,
        _required_resource_keys={
            resources.get(k, k)
            for k in obj._required_resource_keys  # noqa: SLF001
        },
    )


def renamed_parameters(fn: Callable[..., Any], names: Mapping[str, str]) -> Callable[..., Any]:
    """``fn`` with its parameters named by ``names`` (old → new; others unchanged), their
    annotations kept: the returned function takes the new names and calls ``fn`` with the old."""
    sig = inspect.signature(fn)
    hints = get_type_hints(fn)
    old_of = {names[p]: p for p in sig.parameters if p in names}
    params = [
        p.replace(name=names.get(p.name, p.name), annotation=hints.get(p.name, p.annotation))
        for p in sig.parameters.values()
    ]

    def call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return fn(*args, **{old_of.get(k, k): v for k, v in kwargs.items()})

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            yield from call(args, kwargs)

    else:

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return call(args, kwargs)

    del wrapper.__wrapped__  # inspect.signature must read __signature__, not fn's
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {
        names.get(k, k): v for k, v in hints.items()
    }  # get_type_hints reads these
    return wrapper
