"""The series' DSPARK scenarios (issue 38): run by ``treecheck_runner`` in each per-gate child, after the imports
(stdlib, torch and the target tree only: no c128patch imports). Each drives the target tree's own classes and
functions on the CPU, ``scenario_models``' torch models standing in for the CUDA kernels: ``run(gates, ours)`` ->
scenario -> {"status": "passed" | "failed" | "not run", "detail"}; a failure names our module, the upstream
definition involved (module.qualname, file:line) and the scenario. The tests drive the releases with the same models."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import linecache
import os
import sys
import tempfile
import time
import traceback
import types
import weakref
from typing import Any, Dict, List, Optional, Tuple
from unittest import mock

try:
    import torch
except ImportError:  # pragma: no cover - the box runs the scenarios only where torch imports
    torch = None

class SimpleNamespace(types.SimpleNamespace):
    """A scenario's stand-in for an upstream object (``_stand_in``)."""


_BARE: "weakref.WeakSet[Any]" = weakref.WeakSet()  # the tree's objects a scenario made without their __init__


def _bare(cls: Any) -> Any:
    """An instance of the tree's ``cls`` made without its ``__init__`` (which sizes a GPU's buffers); the scenario
    sets what it reads."""
    obj = cls.__new__(cls)
    _BARE.add(obj)
    return obj


def _stand_in(obj: Any) -> bool:
    """Did a scenario make ``obj`` (its fields as the series' base has them)?"""
    try:
        return isinstance(obj, SimpleNamespace) or obj in _BARE
    except TypeError:  # not weak-referenceable: not one of ours
        return False


# scenario_models.py beside this file, by path (the box has no c128patch to import it from)
_spec = importlib.util.spec_from_file_location("c128patch_scenario_models", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "scenario_models.py"))
_models = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_models)
(CHUNK, HEAD_DIM, STATE_DIM, RUNTIME_CONTEXT, FakeKVPool, ReferenceOps, Spec, chunk_state, decode_plans,
 fake_backend, launch_namespaces, runtime_context_standin) = (getattr(_models, name) for name in (
    "CHUNK HEAD_DIM STATE_DIM RUNTIME_CONTEXT FakeKVPool ReferenceOps Spec chunk_state decode_plans "
    "fake_backend launch_namespaces runtime_context_standin").split())

# -- the scenarios -----------------------------------------------------------------------

CONTROLLER = "sglang.srt.layers.attention.dsv4.online_c128_dspark"
RAGGED = "sglang.srt.speculative.ragged_verify"
GATE_ENV, ONLINE_ENV = "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK", "SGLANG_OPT_USE_ONLINE_COMPRESS"
MTP_ENV, RAGGED_ENV = "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP", "SGLANG_RAGGED_VERIFY_MODE"
W, SLOTS = 8, 6


class NotRun(Exception):
    """A module the scenario needs did not import."""


class HarnessError(NotRun):
    """The scenario's own machinery could not drive the tree (not a finding on the tree's code or ours)."""


def _module(name: str) -> types.ModuleType:
    before = set(sys.modules)
    try:
        return importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001
        for stale in {m for m in set(sys.modules) - before if m.split(".")[0] == "sglang"}:
            del sys.modules[stale]  # the next scenario's import starts clean, not from half-run modules
        raise NotRun(f"{name} did not import ({type(exc).__name__}: {exc})") from None


@contextlib.contextmanager
def _launch(env: Dict[str, Optional[str]], **flags: Any):
    """A launch on a CUDA build of torch: ``env`` over the process's, the runtime context serving ``flags``."""
    context = sys.modules.get(RUNTIME_CONTEXT)
    with _process(env):
        sys.modules[RUNTIME_CONTEXT] = runtime_context_standin(launch_namespaces(**flags))
        try:
            yield
        finally:
            if context is None:
                sys.modules.pop(RUNTIME_CONTEXT, None)
            else:
                sys.modules[RUNTIME_CONTEXT] = context


RULES, ENVIRON = "sglang.srt.layers.attention.dsv4.online_c128_dspark_rules", "sglang.srt.environ"
SPELLINGS = ("1", "0", "true", "false", "True", "FALSE", "yes", "no", "y", "n", "Y", "on", "off", "t", "f",
             "enable", "disable", "", " 1", "2", "-1")  # the vocabularies of both, and words either may take next


def _read(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ValueError:
        return ValueError


def _default(field: Any) -> Any:
    return field.default() if callable(field.default) else field.default


def env_reading(rules: types.ModuleType, environ: types.ModuleType) -> None:
    """The rules read the gate envs as upstream's `EnvBool` parses them (every spelling: the same value, or both
    refuse it) and take upstream's defaults (helper 92's case 5: upstream took "on", the rules refused it)."""
    for name in (GATE_ENV, ONLINE_ENV, MTP_ENV):
        field = getattr(environ.envs, name)
        for word in SPELLINGS:
            theirs, mine = _read(field.parse, word), _read(rules.env_bool, {name: word}, name)
            if theirs != mine:
                raise AssertionError(f"{name}={word!r}: upstream's {type(field).__name__}.parse reads "
                                     f"{getattr(theirs, '__name__', theirs)}, the rules "
                                     f"{getattr(mine, '__name__', mine)}")
        if rules.env_bool({}, name) != _default(field):
            raise AssertionError(f"{name} unset: upstream's default is {_default(field)!r}, the rules' False")
    # the ragged-verify mode: the rules keep a copy of upstream's default (doctor judges a launch by it, no sglang
    # import); a new default they admit as they admit the copy decides nothing differently (helper 106's case 9)
    default, copy = _default(getattr(environ.envs, RAGGED_ENV)), rules.env_config({})["ragged_verify_mode"]
    shown = rules._SHOWN_RAGGED_MODES
    if (default in shown) != (copy in shown):
        raise AssertionError(f"{RAGGED_ENV} unset: upstream's default is {default!r}, which the rules "
                             f"{'admit' if default in shown else 'refuse'}, but their copy {copy!r} is "
                             f"{'admitted' if copy in shown else 'refused'}: a launch leaving it unset is judged as a "
                             "mode it does not run")


# -- the launch startup-rules models: the tree's own server-argument resolution and runtime context ---------------

SERVER_ARGS, DSV4_CONFIG = "sglang.srt.server_args", "sglang.srt.configs.deepseek_v4"
RUNTIME_CONTEXT_MODULE = "sglang.srt.runtime_context"  # the tree's own (``RUNTIME_CONTEXT``: the stand-in's name)
LAUNCH = f"--speculative-algorithm DSPARK --speculative-dspark-block-size {W - 1} --device cuda"  # said in findings


def _checkpoint(folder: str) -> str:
    """``folder``, given the config.json of a DeepSeek-V4 checkpoint: the tree's own `DeepSeekV4Config` defaults, its
    architecture, a c4/c128 layer pattern and the sliding window (the model config reads it); no weights."""
    import dataclasses
    import json

    fields = dataclasses.fields(_module(DSV4_CONFIG).DeepSeekV4Config)
    config = {f.name: f.default for f in fields
              if f.default is not dataclasses.MISSING and isinstance(f.default, (bool, int, float, str, type(None)))}
    layers = int(config.get("num_hidden_layers") or 43)
    config.update(architectures=["DeepseekV4ForCausalLM"], compress_ratios=[(4, 128)[i % 2] for i in range(layers)],
                  sliding_window=config.get("window_size", 128))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


@contextlib.contextmanager
def _process(env: Dict[str, Optional[str]]):
    """``env`` over the process's, on a CUDA build of torch (both back on the way out)."""
    with mock.patch.dict(os.environ), mock.patch.multiple(torch.version, cuda=torch.version.cuda or "12.8", hip=None):
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield


def _raised_at(exc: BaseException) -> str:
    """``module.qualname (sglang/...py:line)`` of the tree's frame that raised ``exc`` ("": none)."""
    frames = [(f, n) for f, n in traceback.walk_tb(exc.__traceback__)
              if (f.f_globals.get("__name__") or "").startswith("sglang.")]
    if not frames:
        return ""
    frame, line = frames[-1]
    path = frame.f_code.co_filename
    return f"{frame.f_globals['__name__']}.{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)} " \
           f"({path[path.rfind('/sglang/') + 1:]}:{line})"


def _resolved(env: Dict[str, Optional[str]], folder: str) -> Any:
    """The tree's `ServerArgs` of the scenario's DeepSeek-V4 DSPARK launch (``LAUNCH``, the draft beside the target),
    resolved by its own `resolve_once` (the resolution pipeline: `apply_deepseek_v4_defaults`, the speculative
    decoding handlers ...) under ``env``; what the resolution raises, raised. Run untraced, its output dropped."""
    import io

    server_args = _module(SERVER_ARGS).ServerArgs(
        model_path=folder, speculative_algorithm="DSPARK", speculative_dspark_block_size=W - 1,
        speculative_draft_model_path=folder, device="cuda")
    trace = sys.gettrace()
    sys.settrace(None)
    try:
        with _process(env), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            resolve = getattr(server_args, "resolve_once", None)
            if resolve is not None:  # (a tree whose __post_init__ resolves has resolved)
                resolve()
    finally:
        sys.settrace(trace)
    return server_args


def tree_launch_context(on: bool, folder: str) -> Tuple[types.ModuleType, Any, Any]:
    """The tree's own runtime context of the scenario's launch (gates on: `GATE_ENV` and `ONLINE_ENV` set): its
    `ServerArgs` resolved as the launcher resolves them (``_resolved``) and projected into its config bags by its own
    `create_context` (a tree without it: `RuntimeContext.set_server_args`, what `publish` does). The resolution
    refusing the launch with the gates on but not with them off fails, naming the tree's function that refused and
    our startup check, which admits it; refusing it either way, the scenario's model of the launch is stale: not run.
    ``folder``: the checkpoint's (``_checkpoint``). -> (the tree's runtime_context module, the context, the resolved
    ServerArgs)."""
    rc = _module(RUNTIME_CONTEXT_MODULE)
    gates = {GATE_ENV: "1" if on else None, ONLINE_ENV: "1" if on else None, MTP_ENV: None, RAGGED_ENV: None}
    try:
        server_args = _resolved(gates, folder)
    except NotRun:
        raise
    except Exception as exc:  # noqa: BLE001
        said = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        plain = None
        if on:
            try:
                _resolved({**gates, GATE_ENV: None, ONLINE_ENV: None}, folder)
            except Exception as again:  # noqa: BLE001
                plain = again
        if not on or plain is not None:
            raise NotRun(f"the tree's server-argument resolution refused the scenario's DeepSeek-V4 launch ({LAUNCH}) "
                         f"with the gates off too, in {_raised_at(plain or exc) or 'no function of the tree'}: "
                         f"{type(plain or exc).__name__}: {' '.join(str(plain or exc).split())}") from None
        raise Blame(f"the tree's server-argument resolution refuses the DeepSeek-V4 launch {LAUNCH} with the gates on "
                    f"({GATE_ENV}=1 {ONLINE_ENV}=1), which it takes with them off: {said}",
                    ours=_defined(_module(CONTROLLER).check_online_c128_dspark_startup),
                    theirs=_raised_at(exc) or _defined(_module(SERVER_ARGS).ServerArgs)) from None
    if hasattr(rc, "create_context"):
        context = rc.create_context(server_args, role="scheduler")
    else:
        context = rc.RuntimeContext(parallel=rc.ParallelContext())
        context.set_server_args(server_args)
    return rc, context, server_args


def _leaf(server_args: Any, name: str) -> Tuple[str, Any]:
    """(the namespace path, the tree's namespace class) of the config field ``name`` ((``""``, None): none)."""
    path = _module("sglang.srt.arg_groups.arg_utils").namespace_of(type(server_args)).get(name, "")
    for cls in getattr(type(server_args), "_NAMESPACES", ()):
        if getattr(cls, "_NS_PATH", None) == path and name in getattr(cls, "__annotations__", {}):
            return path, cls
    return path, None


@contextlib.contextmanager
def _tree_launch(tree: Tuple[types.ModuleType, Any, Any], env: Dict[str, Optional[str]], **flags: Any):
    """A launch on a CUDA build of torch: ``env`` over the process's, the tree's runtime context (``tree``) the one
    in effect, ``flags`` set on its config bags where the tree keeps them (its scoped `override`), all undone after.
    A flag the tree's config no longer has: the scenario's model of the launch is stale (not run)."""
    rc, context, server_args = tree
    if not all(hasattr(rc, name) for name in ("_CONTEXT", "_PARALLEL")):  # what its getters read (`use_context`)
        raise NotRun(f"{rc.__name__} keeps its context elsewhere than _CONTEXT and _PARALLEL, where the scenario puts "
                     "the launch's")
    with _process(env), mock.patch.multiple(rc, _CONTEXT=context, _PARALLEL=context.parallel), \
            contextlib.ExitStack() as stack:
        for name, value in flags.items():
            path, _ = _leaf(server_args, name)
            if not path:
                raise NotRun(f"the tree's config has no field {name!r}, which the scenario sets for a launch with "
                             f"--{name.replace('_', '-')}")
            bag = context.config_bag(path.split(".")[0])
            for sub in path.split(".")[1:]:
                bag = getattr(bag, sub)
            stack.enter_context(bag.override(**{name: value}))
        yield


def _config_read(exc: AttributeError, server_args: Any) -> Optional[Blame]:
    """Our code read a field of the tree's runtime config where the tree does not keep it (its bags' `__getattr__`
    refused it): a Blame naming our reading line and where the tree keeps that field now (None: not that)."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    mine = [i for i, (f, _) in enumerate(frames) if f.f_globals.get("__name__") in (RULES, CONTROLLER)]
    theirs = [f for f, _ in frames[mine[-1] + 1:] if (f.f_globals.get("__name__") or "").startswith("sglang.")
              and isinstance(f.f_locals.get("name"), str) and "self" in f.f_locals] if mine else []
    if not theirs:  # not a read of ours the tree's config refused (its bag's `__getattr__`, `ParallelContext._read`)
        return None
    name, bag = theirs[-1].f_locals["name"], theirs[-1].f_locals["self"]
    try:
        where = object.__getattribute__(bag, "_path")
    except AttributeError:
        where = type(bag).__name__
    frame, line = frames[mine[-1]]
    read = linecache.getline(frame.f_code.co_filename, line).strip()
    path, cls = _leaf(server_args, name)
    now = f"the tree keeps it at {path}" if path else "the tree's config has no such field"
    ours = f"{frame.f_globals['__name__']}.{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)} " \
           f"({frame.f_code.co_filename[frame.f_code.co_filename.rfind('/sglang/') + 1:]}:{line})"
    return Blame(f"our code reads {name!r} of the tree's config namespace {where!r} ({read}), which has none: {now} "
                 f"(the DeepSeek-V4 launch {LAUNCH}, resolved by the tree)",
                 ours=ours, theirs=_defined(cls) if cls is not None else _raised_at(exc))


def startup_rules(on: bool) -> None:
    """The startup rules over launch flags and envs, read through the tree's own runtime context of a resolved
    DeepSeek-V4 DSPARK launch (``tree_launch_context``: a launch the tree's resolution refuses with the gates on fails
    here): gate off = upstream; DSPARK admitted; refused otherwise; a config field our code reads where the tree does
    not keep it fails, naming where it does; the envs read as upstream reads them (``env_reading``)."""
    ctl = _module(CONTROLLER)
    env_reading(_module(RULES), _module(ENVIRON))
    with tempfile.TemporaryDirectory(prefix="c128-dsv4-") as folder:
        tree = tree_launch_context(on, _checkpoint(folder))
        _startup_cases(on, ctl, tree)


def _startup_cases(on: bool, ctl: types.ModuleType, tree: Tuple[types.ModuleType, Any, Any]) -> None:
    """`startup_rules`' cases, under the tree's own runtime context of the launch (``tree``)."""
    on_env = {GATE_ENV: "1", ONLINE_ENV: "1", MTP_ENV: None, RAGGED_ENV: None}
    off_env = {GATE_ENV: None, ONLINE_ENV: None, MTP_ENV: None, RAGGED_ENV: None}
    cases = [  # (env, launch flags, algorithm, banks, a word of the refusal; None: not refused)
        (off_env, {}, Spec(False), 4, None), (off_env, {"enable_two_batch_overlap": True}, Spec(), 64, None),
        (on_env, {}, Spec(), W, None), ({**on_env, RAGGED_ENV: "compact"}, {}, Spec(), W, None),
        (on_env, {}, Spec(False), W, "EAGLE"), ({**on_env, RAGGED_ENV: "bogus"}, {}, Spec(), W, "bogus"),
        (on_env, {}, Spec(), 11, "11"), (on_env, {"enable_two_batch_overlap": True}, Spec(), W, "overlap"),
    ]
    for env, flags, spec, banks, refusal in cases:
        case = f"{spec.name}, {banks} banks, {flags or 'default launch'}, env {env}"
        with _tree_launch(tree, env, **flags):
            try:
                if env[GATE_ENV] is None:  # the pool configurator asks only with the gate set
                    ctl.refuse_unsupported(spec_algorithm=spec, num_draft_tokens=banks)
                elif ctl.check_online_c128_dspark_startup(spec, banks) is not True:
                    raise AssertionError(f"{case}: the startup check did not admit DSPARK")
            except ValueError as exc:
                if refusal is None or refusal not in str(exc):
                    raise AssertionError(f"{case}: refused: {exc}") from exc
                continue
            except AttributeError as exc:
                blame = _config_read(exc, tree[2])
                if blame is None:
                    raise
                if not on or env[GATE_ENV] is None:  # no launch without the gates reads it (the pool configurator,
                    continue                         # the controller): the run with the gates on says it
                raise blame from None
        if refusal is not None:
            raise AssertionError(f"{case}: admitted, expected a refusal naming {refusal!r}")
    if on:  # the banks of the tree's own pool, built as a DSPARK launch builds it: our controller admits them
        with _tree_launch(tree, on_env):
            ctl.OnlineC128DsparkController(fake_backend(tree_pool(), width=W, device="cpu", rows=SLOTS + 8))


# -- the tree's own pool (helper 104's case c12) -------------------------------------------

POOL_LAYERS = [0, 128, 0, 128, 0]  # two c128 layers (1 and 3) among uncompressed ones, as `FakeKVPool` lays them


def _asked_for_banks(calls: List[Tuple[Any, int]]) -> Any:
    """A profile function recording each call of a function of the tree that takes ``online_mtp_max_draft_tokens``
    (the bank count) as an argument: (its code, the count it was asked for)."""
    def profile(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and "online_mtp_max_draft_tokens" in code.co_varnames[:code.co_argcount +
                                                                                   code.co_kwonlyargcount]:
            calls.append((frame.f_globals.get("__name__"), code, frame.f_locals["online_mtp_max_draft_tokens"]))
    return profile


def _pool_launch() -> Dict[str, Any]:
    """What the tree's `DeepSeekV4TokenToKVPool.__init__` reads of the runtime context for a DSPARK launch of verify
    width ``W`` with the defaults (`get_exec`, `get_spec`: the pool module's own names, bound at its import)."""
    return dict(
        get_exec=lambda: SimpleNamespace(
            kernel=SimpleNamespace(dsv4_attn_backend="flashmla", enable_deepseek_v4_fp4_indexer=False),
            features=SimpleNamespace(enable_encoder_swa_bounded_replay=False)),
        get_spec=lambda: SimpleNamespace(speculative_algorithm="DSPARK", speculative_num_draft_tokens=W))


def tree_pool(pool_class: Any = None) -> Any:
    """The tree's DSV4 pool for a DSPARK launch of verify width ``W`` with the gates on, built by the tree: its
    `DeepSeekV4TokenToKVPool.__init__` (or ``pool_class``'s) on the CPU, given what the pool configurator and the KV
    cache configurator hand it for ``SLOTS - 1`` running requests (the c128 state pool one row a request slot, the
    bank count `max_speculative_num_draft_tokens()`: ``W``), two c128 layers (`POOL_LAYERS`) of the compress-state
    dtypes the tree's KV cache configurator chooses for the launch (`tree_state_dtypes`), tiny KV pages; so its
    request slots, banks, rows, slot offset and state dtype are the tree's (`_init_paged_compress_states` ->
    `CompressStatePool.__init__`). A pool whose state rows hold fewer draft banks than ``W`` fails (helper 104's case
    c12: banks allocated only under the MTP env), naming the function of the tree that was asked for ``W`` banks and
    allocated fewer, and our controller, which needs them (what its startup check then says); one whose request-slot
    bound leaves a request's rows out fails at the controller's first plan or commit (`_slot_bound`, helper 106's
    case 04). A field the pool reads that the launch's stand-in (`_pool_launch`) lacks: not run (the scenario models
    the series' base). A state dtype our ops refuse (helper 124's case B4: float16, made upstream's default) fails,
    naming the tree's function that chose it and our op's check."""
    mod, ctl = _module(POOL), _module(CONTROLLER)
    (c4_dtype, c128_dtype), chooser = tree_state_dtypes()
    pool_class, calls, launch = pool_class or mod.DeepSeekV4TokenToKVPool, [], _pool_launch()
    with mock.patch.multiple(mod, **launch, create=True):
        sys.setprofile(_asked_for_banks(calls))
        try:
            pool = pool_class(
                max_num_reqs=SLOTS - 1, swa_size=2 * 256, c4_size=256, c128_size=256, c4_state_pool_size=0,
                c128_state_pool_size=SLOTS, page_size=256, swa_page_size=256, dtype=torch.float8_e4m3fn,
                c4_state_dtype=c4_dtype, c128_state_dtype=c128_dtype, qk_nope_head_dim=HEAD_DIM - 64,
                qk_rope_head_dim=64, indexer_head_dim=128, layer_num=len(POOL_LAYERS), device="cpu",
                enable_memory_saver=False, compression_ratios=list(POOL_LAYERS), online_mtp_max_draft_tokens=W)
        except AttributeError as exc:
            stand_in = getattr(exc, "obj", None)
            if not isinstance(stand_in, SimpleNamespace):
                raise
            frames = [(f, n) for f, n in traceback.walk_tb(exc.__traceback__)
                      if f.f_globals.get("__name__", "").startswith("sglang.")]
            raise NotRun(f"the scenario's launch stand-in has no {exc.name!r}, which "
                         f"{_where_called(frames[-1][0]) if frames else 'the pool'} reads (upstream changed it; the "
                         "scenario models the series' base)") from None
        finally:
            sys.setprofile(None)
    states = [state for state in pool.compress_state_pools if state is not None]
    # the draft banks each state allocated: its rows over a bank's (bank 0, the committed state, is not a draft bank)
    banks = min(int(s.kv_score_buffer.kv_score.shape[0]) // (getattr(s, "_logical_size", 0) or SLOTS + 2) - 1
                for s in states)
    if banks < W:
        asked = [code for name, code, count in calls if count == W and (name or "").startswith("sglang.")]
        theirs = _defined_code(asked[-1]) if asked else _defined(pool_class._make_compress_state_pool)
        try:
            with _launch({GATE_ENV: "1", ONLINE_ENV: "1", MTP_ENV: None}):
                ctl.OnlineC128DsparkController(fake_backend(pool, width=W, device="cpu", rows=SLOTS + 8))
            said = "its startup check admitted it"
        except (ValueError, RuntimeError) as exc:
            said = "its startup check says: " + " ".join(str(exc).split())
        name = getattr(asked[-1], "co_qualname", asked[-1].co_name) if asked else "the pool's state-pool factory"
        raise Blame(f"the tree's pool, built for a DSPARK launch of verify width {W} with the gates on, holds {banks} "
                    f"draft banks ({name} was asked for {W}): the controller's verify writes {W} banks a request, "
                    f"one a verify token ({said})", ours=_defined(ctl.OnlineC128DsparkController.__init__),
                    theirs=theirs)
    for dtype in sorted({s.kv_score_buffer.kv_score.dtype for s in states}, key=str):
        try:
            _models._state_dtype(dtype)  # the op's `_module(state_dtype)`, which the first verify plan calls
        except TypeError as exc:
            raise Blame(f"the tree's pool, built for a default DSPARK launch with the gates on ({GATE_ENV}=1 "
                        f"{ONLINE_ENV}=1, {STATE_DTYPE_ENV} unset), holds {dtype} c128 compress state, as "
                        f"{chooser.__qualname__} chose it (c4 {c4_dtype}, c128 {c128_dtype}): our ops refuse it at "
                        f"the first DSPARK verify: {exc}", ours=_defined(_module(KERNEL_OPS)._module),
                        theirs=_defined(chooser)) from None
    for state in states:
        state.kv_score_buffer.kv_score.fill_(float("nan"))  # read before written: NaN in the checks
    return pool


CONFIGURATOR, STATE_DTYPE_ENV = "sglang.srt.mem_cache.kv_cache_configurator", "SGLANG_DSV4_COMPRESS_STATE_DTYPE"
KERNEL_OPS = "sglang.kernels.ops.attention.dsv4.online_c128_dspark"


def tree_state_dtypes() -> Tuple[Tuple[Any, Any], Any]:
    """((c4, c128) compress-state dtypes, the function that chose them): what the tree's KV cache configurator hands
    the DSV4 pool of a default launch (its `_get_dsv4_compress_state_dtypes`, which sizes the pools it builds), read
    with the gates on and ``STATE_DTYPE_ENV`` unset, as a default DSPARK launch reads it. A tree without that
    function: not run (the scenario models the series' base), never a dtype of the scenario's own choosing."""
    held = sys.modules.get(RUNTIME_CONTEXT)
    standin = held is not None and getattr(held, "__file__", None) is None  # a launch's (``_launch``)
    if standin:  # imported with the tree's own runtime context: the stand-in has no get_model, which it imports
        del sys.modules[RUNTIME_CONTEXT]
    try:
        chooser = getattr(_module(CONFIGURATOR), "_get_dsv4_compress_state_dtypes", None)
    finally:
        if standin:
            sys.modules[RUNTIME_CONTEXT] = held
    if not callable(chooser):
        raise NotRun(f"{CONFIGURATOR} has no _get_dsv4_compress_state_dtypes, which chooses the compress-state dtypes "
                     "of the pool the scenario builds (upstream changed it; the scenario models the series' base)")
    with _process({GATE_ENV: "1", ONLINE_ENV: "1", MTP_ENV: None, STATE_DTYPE_ENV: None}):
        return tuple(chooser()), chooser


def _slot_bound(op: Any, name: str, pool: Any) -> Any:
    """``op`` (a kernel's model), refusing a call whose ``max_num_reqs`` leaves out a row that has tokens to verify or
    commit: the kernels skip such a row without a word (no bank written, no chunk emitted, no commit; helper 106's
    case 04: the pool's request-slot bound 0 unless the MTP env). The finding names our call and the tree's function
    that returned the bound to our code (`culprit`'s ``handed``), else the pool's `__init__`."""
    signature = inspect.signature(op)

    def bounded(*args: Any, **kw: Any) -> Any:
        got = signature.bind(*args, **kw).arguments
        bound, rows = int(got["max_num_reqs"]), got["req_pool_indices"].tolist()
        lens = got["verify_lens"] if name == "dspark_verify_plan" else got["new_seq_lens"] - got["seq_lens"]
        left = sorted({int(r) for r, n in zip(rows, lens.tolist()) if n > 0 and not 0 <= int(r) < bound})
        if left:
            what = "verify plan" if name == "dspark_verify_plan" else "commit"
            raise Blame(f"dspark c128 {what}: max_num_reqs {bound} leaves out the rows of request slots {left}, which "
                        f"the kernel skips (no bank written, no chunk emitted, nothing committed); the tree's pool, "
                        f"built by {type(pool).__qualname__}.__init__ for {SLOTS - 1} running requests, has request "
                        f"slots 0..{SLOTS - 1}", ours=_tree_caller(),
                        theirs=_defined(type(pool).__init__), values={"max_num_reqs": bound})
        return op(*args, **kw)
    return bounded


def _defined_code(code: Any) -> str:
    """``module.qualname (sglang/...py:line)`` of a code object of the tree."""
    path = code.co_filename
    module = path[path.rfind("/sglang/") + 1:-3].replace("/", ".")
    return f"{module}.{getattr(code, 'co_qualname', code.co_name)} ({path[path.rfind('/sglang/') + 1:]}:" \
           f"{code.co_firstlineno})"


def _upstream_compress(**kwargs: Any) -> None:
    raise AssertionError("upstream's compress_forward ran for a DSPARK verify plan")


class Decode:
    """Requests with float64 histories; a step (prepare, plan, compress, accept, commit) checked against them."""

    def __init__(self, ctl: types.ModuleType, ragged: Optional[types.ModuleType], pool_class: Any = None,
                 layers: int = 2, plan_type: Any = None, own_pool: bool = True) -> None:
        self.ctl, self.ragged = ctl, ragged
        self.ops = ReferenceOps(*[plan_type] if plan_type else [])  # where upstream code sees it: the target's type
        self.gen = torch.Generator().manual_seed(0)
        self.stride = SLOTS + 2
        self.states = [torch.full(((1 + W) * self.stride, STATE_DIM), float("nan")) for _ in range(layers)]
        self.apes = [self._randn(CHUNK, HEAD_DIM) for _ in range(layers)]
        pool = FakeKVPool(self.states, SLOTS, W)
        if own_pool and getattr(sys.modules.get(POOL), "ONLINE_C128", False):  # the gates on
            pool = tree_pool(pool_class)  # upstream's pool as its __init__ builds it: its request slots, banks, layout
            self.states = [state.kv_score_buffer.kv_score for state in pool.compress_state_pools if state is not None]
        elif pool_class is not None:  # upstream's pool class over the same state pools: its own getters read them
            for state in pool.compress_state_pools[1::2]:
                state.online_mtp_state_slot_offset, state.online_mtp_max_draft_tokens = self.stride, W
            pool, fields = _bare(pool_class), vars(pool)  # no __init__: it allocates device buffers
            pool.__dict__.update(fields, online_c128_state_num_req_slots=SLOTS)
        self.backend = _target_backend(pool, ctl)
        self.controller = self.backend.online_c128_dspark
        for op in ("dspark_verify_plan", "dspark_commit"):  # the kernels skip the rows past their slot bound
            setattr(self.ops, op, _slot_bound(getattr(self.ops, op), op, pool))
        self.seq: Dict[int, int] = {}
        self.captured: set = set()  # the verify graphs captured: (rows, tokens, compact)
        self.hist: Dict[Tuple[int, int], Tuple[int, Any, Any]] = {}  # (layer, slot) -> (base, kv, score)

    def _randn(self, *shape: int, scale: float = 1.0) -> Any:
        return (torch.randn(*shape, generator=self.gen, dtype=torch.float64) * scale).float().double()

    def _randint(self, lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=self.gen))

    def _state(self, layer: int, slot: int, end: int) -> Any:
        base, kv, score = self.hist[layer, slot]
        first = ((end - 1) // CHUNK) * CHUNK
        return chunk_state(kv[first - base:end - base], score[first - base:end - base], self.apes[layer], first)

    def prefill(self, slot: int, seq_len: int) -> None:
        """A prefill between verify steps: upstream's compress for its plan, bank 0 the state of its open chunk."""
        plan = self.ops.plan_type(128, torch.zeros(1, 16, dtype=torch.uint8), None, None)
        if self.controller.compress_fn(plan, _upstream_compress) is not _upstream_compress:
            raise AssertionError("a prefill plan was not left to upstream's compress")
        self.seq[slot], base = seq_len, ((seq_len - 1) // CHUNK) * CHUNK
        for layer, state in enumerate(self.states):
            kv, score = self._randn(seq_len - base, HEAD_DIM), self._randn(seq_len - base, HEAD_DIM, scale=2.0)
            self.hist[layer, slot] = (base, kv, score)
            state[slot] = torch.cat(self._state(layer, slot, seq_len)).float() if seq_len % CHUNK else float("nan")

    def step(self, slots: List[int], padded_bs: int, compact: bool, extra: int = 0, replay: bool = False) -> None:
        """One verify step; its metadata (our `prepare_verify`, then our plan) as the model runner asks the tree's
        backend for it: eager, or ``replay`` a CUDA-graph replay (`_verify_metadata`)."""
        real = [self._randint(1, W) if compact else W for _ in slots]
        live = padded = None
        tokens = min(sum(real) + extra, padded_bs * W) if compact else padded_bs * W
        if compact:  # upstream's layouts: the batch's, and the bucket's (padding rows of length 0)
            live = self.ragged.RaggedVerifyLayout.from_verify_lens_device(
                verify_lens=torch.tensor(real, dtype=torch.int32), graph_num_tokens=tokens)
            padded = live.padded_to_bucket(padded_bs=padded_bs)
        starts = padded.extend_start_loc.tolist() if compact else [b * W for b in range(padded_bs)]
        seq = [self.seq[s] for s in slots] + [1] * (padded_bs - len(slots))
        if replay:  # its graph, as the runner captured it at startup
            self.capture(padded_bs, compact, tokens)
        plan = _verify_metadata(self.backend, slots, seq, tokens, live, replay)
        emits = decode_plans(plan.plan_c)
        for layer, state in enumerate(self.states):
            x = torch.full((tokens, 2 * HEAD_DIM), float("nan"), dtype=torch.float64)
            for b, slot in enumerate(slots):
                base, kv, score = self.hist[layer, slot]
                new_kv, new_score = self._randn(real[b], HEAD_DIM), self._randn(real[b], HEAD_DIM, scale=2.0)
                self.hist[layer, slot] = (base, torch.cat([kv, new_kv]), torch.cat([score, new_score]))
                x[starts[b]:starts[b] + real[b]] = torch.cat([new_kv, new_score], dim=1)
            out = self.compress(plan, layer=layer, kv_score_buffer=state.view(-1, 1, STATE_DIM),
                                kv_score_input=x.float(), ape=self.apes[layer].float())
            self._check_emits(layer, slots, starts, seq, emits, out)
        self._accept_and_commit(slots, real, seq, live)

    def capture(self, padded_bs: int, compact: bool, tokens: Optional[int] = None) -> None:
        """The target-verify graph of ``padded_bs`` rows and ``tokens`` tokens (default: every row ``W``), captured
        as the decode CUDA-graph runner captures it (`_capture_verify`), once."""
        key = (padded_bs, padded_bs * W if tokens is None else tokens, compact)
        if key not in self.captured:
            self.captured.add(key)
            _capture_verify(self.backend, *key)

    def compress(self, plan: Any, layer: int, **tensors: Any) -> Any:
        """Layer ``layer``'s c128 compress step as upstream's compressor calls it (``compressor_callback`` runs the
        compressor's own)."""
        return self.controller.compress_fn(plan, _upstream_compress)(
            **tensors, plan=plan, compress_ratio=128, head_dim=HEAD_DIM, out=None, is_online=True)

    def _check_emits(self, layer: int, slots: List[int], starts: List[int], seq: List[int], emits, out) -> None:
        for index, entry in enumerate(emits):
            if entry is not None:
                b = max(i for i in range(len(slots)) if starts[i] <= entry[1])
                base, kv, score = self.hist[layer, slots[b]]
                last, first = entry[0] - 1, entry[0] - CHUNK
                want = chunk_state(kv[first - base:last + 1 - base], score[first - base:last + 1 - base],
                                   self.apes[layer], first)[2]
                _close(out[index], want, f"layer {layer}: the chunk closed at {last} of slot {slots[b]}",
                       self.states[layer].dtype)

    def _accept_and_commit(self, slots: List[int], real: List[int], seq: List[int], live: Any) -> None:
        accepted = [self._randint(1, n) for n in real]
        new = [seq[b] + accepted[b] for b in range(len(slots))]
        self.ctl.commit_after_verify(
            self.backend.model_runner, seq_lens=torch.tensor(seq[:len(slots)]), new_seq_lens=torch.tensor(new),
            req_pool_indices=torch.tensor(slots), layout=live)
        for b, slot in enumerate(slots):
            for layer, state in enumerate(self.states):
                base, kv, score = self.hist[layer, slot]
                self.hist[layer, slot] = (base, kv[:new[b] - base], score[:new[b] - base])  # the accepted drafts
                if new[b] % CHUNK:
                    got = state[slot].double()
                    for i, want in enumerate(self._state(layer, slot, new[b])):
                        _close(got[i * HEAD_DIM:(i + 1) * HEAD_DIM], want, f"layer {layer}: bank 0 of slot {slot}",
                               state.dtype)
                cut = (new[b] // CHUNK) * CHUNK
                self.hist[layer, slot] = (cut, kv[cut - base:new[b] - base], score[cut - base:new[b] - base])
            self.seq[slot] = new[b]


FORWARD = "sglang.srt.model_executor.forward_batch_info"


def _fields(obj: Any, values: Dict[str, Any]) -> None:
    """The model's fields set on the tree's bare ``obj``, less those its class now defines as a method (helper 131's
    C1: a field turned method; set, the value hid the method, and upstream's own new calls of it failed first, not
    our read of it): the tree's method stays, and what reads it as the field gets the method."""
    kept = {name: value for name, value in values.items()
            if not inspect.isfunction(inspect.getattr_static(type(obj), name, None))}
    obj.__dict__.update(kept)


def _target_backend(pool: Any, ctl: types.ModuleType) -> Any:
    """The tree's `DeepseekV4AttnBackend` of a DSPARK target over ``pool``, made without `__init__` (it reads the
    model and allocates device buffers): what `__init__` sets that the verify metadata reads, for a DSPARK launch
    (no EAGLE top-k: `mtp_enabled` False), and the two online c128 controllers built as `__init__` builds them, the
    tree's `OnlineC128MTPController` first, then ours over the backend (its startup check asks the MTP one). Stood in
    (CUDA): the core attention and indexer metadata, the token expansion, upstream's compressor plans, the graph
    metadata copy of a replay and the pool's full-to-SWA translation."""
    mod = _module(BACKEND)
    backend = _bare(mod.DeepseekV4AttnBackend)
    fake = fake_backend(pool, width=W, device="cpu", rows=SLOTS + 8)
    rows = fake.req_to_token.shape[0]
    del fake.online_c128_mtp  # the tree's own, below
    _fields(backend, vars(fake))
    backend.__dict__.update(
        page_size=256, swa_page_size=256, MAX_SEQ_LEN_FOR_CAPTURE=fake.req_to_token.shape[1],
        req_to_token_pool=SimpleNamespace(req_to_token=fake.req_to_token), topk=0, mtp_enabled=False,
        speculative_num_steps=0, speculative_step_id=0, is_dspark_draft=False, is_draft_runner=False,
        needs_cpu_seq_lens=False, present_ratios=(128,), low_ratios=(), has_c4=False, has_c128=True,
        trtllm_attn=False, forward_metadata=None, tail_forward_metadata=None, enable_decoder_swa_bounded_replay=False,
        builds_verify_metadata_early=False, _early_verify_metadata_ids=set(), encoder_replay=False,
        encoder_row_floor=None, cuda_int32_kwargs={"device": fake.device, "dtype": torch.int32},
        extend_seq_lens_buffer=torch.full((rows,), W, dtype=torch.int32),
        extend_start_loc_buffer=torch.zeros(rows, dtype=torch.int32),
        make_core_attn_metadata=lambda **kw: SimpleNamespace(low_ratios=(), swa_out_cache_loc=None),
        expand_extend_with_same_length=lambda **kw: (None, None),
        _expand_prefill_casually_vectorized=lambda **kw: (None, None),
        init_forward_metadata_indexer=lambda *a, **kw: None,
        replay_cuda_graph_metadata_from=lambda bs, temp_metadata, bucket: setattr(
            backend, "forward_metadata", temp_metadata))
    backend.model_runner.attn_backend = backend
    pool.__dict__.update(request_window=None, swa_req_ring_size=None, translate_loc_from_full_to_swa=lambda loc: loc)
    backend.online_c128_mtp = mod.OnlineC128MTPController(backend)
    backend.online_c128_dspark = ctl.OnlineC128DsparkController(backend)
    return backend


def _verify_batch(backend: Any, slots: List[int], seq: List[int], tokens: int, live: Any,
                  capture: bool = False) -> Any:
    """A target-verify `ForwardBatch` as the model runner hands it to the backend: a step's (``slots`` real rows of
    ``seq`` in ``len(seq)``, ``tokens`` tokens, the layout ``live``), or ``capture`` the decode CUDA-graph runner's
    capture batch (`capture_prepare`: every row the fill length, request slot 0, no draft tokens)."""
    padded_bs = len(seq)
    as64 = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    return SimpleNamespace(
        forward_mode=_module(FORWARD).ForwardMode.TARGET_VERIFY, batch_size=padded_bs, seq_lens=as64(seq),
        seq_lens_cpu=as64(seq), seq_lens_sum=sum(seq), req_pool_indices=as64(slots + [0] * (padded_bs - len(slots))),
        out_cache_loc=torch.zeros(tokens, dtype=torch.int64), positions=torch.zeros(tokens, dtype=torch.int64),
        spec_info=SimpleNamespace(draft_token=None if capture else torch.zeros(len(slots) * W, dtype=torch.int64),
                                  draft_token_num=W, ragged_verify_layout=live),
        encoder_swa_replay=False, encoder_swa_row_floor=None, encoder_swa_compress_rows=None,
        max_seq_len_override=None)


@contextlib.contextmanager
def _metadata_calls(backend: Any, live: Any):
    """The backend asked for verify metadata: yields the calls of our `prepare_verify` ((kwargs, the calling frame))
    and of upstream's raw builder `init_forward_metadata_target_verify` (its calling frames)."""
    mod, controller, calls, raw = _module(BACKEND), backend.online_c128_dspark, [], []

    def prepare_verify(forward_batch: Any, **kw: Any) -> None:  # ours, recording who called it with what
        calls.append((kw, sys._getframe(1)))
        return type(controller).prepare_verify(controller, forward_batch, **kw)

    def target_verify(*args: Any, **kw: Any) -> Any:
        raw.append(sys._getframe(1))
        return type(backend).init_forward_metadata_target_verify(backend, *args, **kw)

    context = runtime_context_standin(launch_namespaces())
    getters = {n: getattr(context, n) for n in ("get_parallel", "get_exec") if hasattr(mod, n)}
    controller.prepare_verify, backend.init_forward_metadata_target_verify = prepare_verify, target_verify
    try:
        with mock.patch.multiple(mod, create_paged_compressor_data=lambda **kw: SimpleNamespace(upstreams=True),
                                 **getters), _launch({RAGGED_ENV: "compact" if live is not None else None}):
            yield calls, raw
    finally:
        del controller.prepare_verify, backend.init_forward_metadata_target_verify


def _prepared(backend: Any, path: str, calls: List[Any], raw: List[Any], entry: Any, rows: int, padded_bs: int,
              live: Any) -> None:
    """Our `prepare_verify` was called once, with the batch's rows (static: ``rows`` verify rows; compact: the
    layout's), where upstream's metadata ``path`` built the raw verify metadata; else the finding names our hook and
    the upstream definition that skipped it (the caller of the raw builder) or called it with other rows."""
    controller, compact = backend.online_c128_dspark, live is not None
    if len(calls) != 1:
        theirs = _where_called(raw[-1]) if raw and not calls else _defined(entry)
        raise Blame(f"the {path} target-verify metadata ({'compact' if compact else 'static'}, {padded_bs} rows) "
                    f"called prepare_verify {len(calls)} times, not once",
                    ours=_defined(type(controller).prepare_verify), theirs=theirs)
    [(kw, caller)] = calls
    layout = kw.get("ragged_layout")
    if kw.get("bs") != padded_bs or compact != (layout is not None) or not compact and kw.get(
            "verify_bs") != rows or compact and int(layout.bs) != padded_bs:
        said = {k: v if k != "ragged_layout" or v is None else f"a layout of {int(v.bs)} rows" for k, v in kw.items()}
        raise Blame(f"the {path} target-verify metadata ({'compact' if compact else 'static'}) called "
                    f"prepare_verify with {said} for a batch of {rows} verify rows in {padded_bs}",
                    ours=_defined(type(controller).prepare_verify), theirs=_where_called(caller))


def _capture_verify(backend: Any, padded_bs: int, tokens: int, compact: bool) -> None:
    """The decode CUDA-graph runner's capture of a target-verify graph of ``padded_bs`` rows and ``tokens`` tokens
    (`capture_one_batch_size`): `init_forward_metadata_out_graph(fb, in_capture=True)` over its capture batch
    (compact: the layout `build_capture_verify_lens` packs), then, recorded in the graph,
    `init_forward_metadata_in_graph`, whose Raw->Full upgrade builds our plan. A capture path that skips our
    `prepare_verify` (helper 106's case 01: a capture-only helper without the host prep) fails naming it: the server
    would not start with CUDA graphs."""
    live = None
    if compact:
        ragged = _module(RAGGED)
        lens = ragged.build_capture_verify_lens(num_tokens=tokens, num_slots=min(tokens, padded_bs),
                                                num_draft_tokens=W)
        live = ragged.RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=lens, device=torch.device("cpu"),
                                                          grid=[tokens])
    fill = int(backend.get_cuda_graph_seq_len_fill_value())
    fb = _verify_batch(backend, [], [fill] * padded_bs, tokens, live, capture=True)
    fb.req_pool_indices = torch.zeros(padded_bs, dtype=torch.int64)
    with _metadata_calls(backend, live) as (calls, raw):
        backend.init_forward_metadata_out_graph(fb, in_capture=True)
        _prepared(backend, "capture", calls, raw, type(backend).init_forward_metadata_out_graph, padded_bs,
                  padded_bs, live)
        backend.init_forward_metadata_in_graph(fb)


def _verify_metadata(backend: Any, slots: List[int], seq: List[int], tokens: int, live: Any, replay: bool) -> Any:
    """A target-verify batch's metadata from the tree's backend where the model runner asks for it: eager,
    `init_forward_metadata`; a CUDA-graph replay, `init_forward_metadata_out_graph` (the replay prep), then
    `init_forward_metadata_in_graph` as the graph recorded it. Returns the c128 plan upstream's metadata holds. Our
    `prepare_verify` gets what upstream's code hands it: the rows it must be given are the batch's (static: every
    real row verifies W tokens; compact: the batch's layout); else the step fails naming our hook and the upstream
    definition that called it (helper 103's case c07: `verify_bs` 0 unless online MTP, so no bank was written)."""
    fb, path = _verify_batch(backend, slots, seq, tokens, live), "replay" if replay else "eager"
    with _metadata_calls(backend, live) as (calls, raw):
        if replay:
            backend.init_forward_metadata_out_graph(fb)
            _prepared(backend, path, calls, raw, type(backend).init_forward_metadata_out_graph, len(slots), len(seq),
                      live)
            backend.init_forward_metadata_in_graph(fb)
        else:
            backend.init_forward_metadata(fb)
            _prepared(backend, path, calls, raw, type(backend).init_forward_metadata, len(slots), len(seq), live)
    return backend.forward_metadata.c128_compress_metadata


def _where_called(frame: Any) -> str:
    name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
    path = frame.f_code.co_filename
    return f"{frame.f_globals.get('__name__')}.{name} ({path[path.rfind('/sglang/') + 1:]}:{frame.f_lineno})"


# how far from the float64 reference a state of each dtype may be: float32 rounding, else bfloat16's (8 bits: a state
# the tree's configurator chose bfloat16 is rounded at each commit; helper 126's case d). A wrong bank, slot or chunk
# is off by the data's own size.
_TOLERANCE = {"torch.float32": 1e-4, "torch.bfloat16": 5e-2}


def _close(got: Any, want: Any, what: str, state_dtype: Any) -> None:
    err, tol = float((got.double() - want).abs().max()), _TOLERANCE[str(state_dtype)]
    if not err <= tol * (1 + float(want.abs().max())):
        raise AssertionError(f"{what}: off the float64 reference by {err:.3g} ({state_dtype} state)")


@contextlib.contextmanager
def _decode(on: bool, compact: bool, pool_class: Any = None, plan_type: Any = None, own_pool: bool = True):
    """The tree's controller over a DSPARK backend, its kernels the torch models; inert with the gates off. Gates on,
    over the tree's own pool (`tree_pool`) unless ``own_pool`` is False (the scenarios of the worker's step and of
    upstream's metadata, which read no bank: the scenario's `FakeKVPool`, so a pool's fault fails those that use it)."""
    ctl, ragged = _module(CONTROLLER), _module(RAGGED) if compact else None
    _module(BACKEND)  # imported as a launch imports it, before the runtime context stands in
    with _launch({}):
        sim = Decode(ctl, ragged, pool_class, plan_type=plan_type, own_pool=own_pool)
    if sim.controller.enabled() != on or not on and sim.controller.compress_fn(None, _close) is not _close:
        raise AssertionError(f"the controller is {'dis' if on else 'en'}abled with the gates {'on' if on else 'off'}")
    kernels, ctl._ops = ctl._ops, lambda: sim.ops
    try:
        yield sim
    finally:
        ctl._ops = kernels


def _steps(on: bool, compact: bool, plan: List[Tuple[List[int], int, int]]) -> None:
    """``plan``: (slots, padded rows, extra tokens) per verify step, requests admitted around chunk edges."""
    with _decode(on, compact) as sim:
        for slot, seq_len in zip(range(1, SLOTS), (1, 127, 128, 129, 255)) if on else ():
            sim.prefill(slot, seq_len)
        for slots, padded_bs, extra in plan if on else ():
            sim.step(slots, padded_bs, compact, extra)


def decode(on: bool) -> None:
    """Several steps, compact and static, with prefills between them, checked against float64."""
    steps = [(sorted({1 + (step + k) % (SLOTS - 1) for k in range(1 + step % 4)}), step) for step in range(6)]
    with _decode(on, True) as sim:
        for slots, step in steps if on else ():  # the graphs the steps replay, captured at startup
            if step % 3 == 1:
                sim.capture(len(slots) + step % 3, step % 2 == 0)
        for slot, seq_len in zip(range(1, SLOTS), (1, 120, 128, 250, 381)) if on else ():
            sim.prefill(slot, seq_len)
        for slots, step in steps if on else ():
            sim.step(slots, len(slots) + step % 3, step % 2 == 0, extra=step, replay=step % 3 == 1)
            if step == 3:
                sim.prefill(slots[0], CHUNK * 2 - 3)  # a finished request's slot serves a new one


COMPRESSOR, POOL = "sglang.srt.layers.attention.dsv4.compressor_v2", "sglang.srt.mem_cache.deepseek_v4_memory_pool"


def compressor_callback(on: bool) -> None:
    """Upstream's compressor, entered where the model enters it (the backend's `forward_core_compressor`, the
    compressor mixin's), calls the controller's `compress_fn` for its verify plans, over upstream's pool class (its
    `get_online_c128_*` getters, its per-layer getters), checked as in `_steps`; prefill plans, and all with the gates
    off, go to upstream's. A c128 layer routed anywhere but through our `compress_fn` (helper 97's case c1b: a new
    method calling `compress_forward` itself) runs upstream's compress for a DSPARK verify plan and fails. The layer's
    compressor is upstream's own `Compressor` (`_tree_compressor`): what its `compute_kv_score` returns is what our
    verify compress gets, so a dtype or shape our kernel refuses fails, naming it (helper 124's case B5: bf16 kv_score
    for online c128). Stood in: the CUDA kernels (`compress_forward`, `compress_norm_rope_store`: the torch models),
    the model's hidden states (float32 rows its projection maps onto the step's kv|score rows), the KV cache pages,
    the launch's parallel context (one GPU); gates off, the compressor's `get_state_pool` (the scenario's state pools
    are not the tree's there)."""
    comp, stored, upstream, verifying = _module(COMPRESSOR), [], [], []
    core, rc = _module(CORE_COMPRESSOR), _module(RUNTIME_CONTEXT_MODULE)  # the tree's (before `_launch`'s)
    kernels = comp.compress_forward, comp.compress_norm_rope_store

    def forward(**kw: Any) -> Any:  # upstream's, for prefill plans only: its caller is named when a verify gets it
        if verifying:
            raise AssertionError(f"upstream's compress_forward ran for a DSPARK verify plan (it got a "
                                 f"{type(kw['plan']).__module__}.{type(kw['plan']).__qualname__})")
        upstream.append(kw["plan"])
        return kw["kv_score_input"]

    comp.compress_forward = forward
    comp.compress_norm_rope_store = lambda kv, plan, **kw: stored.append(kv)
    backend = type("DeepseekV4AttnBackend", (comp.CompressorBackendMixin,), {})()
    entry = getattr(backend, "forward_core_compressor", None) or backend.forward_unified  # the model's call
    layer_ids: List[int] = []

    compressors: List[Tuple[Any, Any]] = []  # per c128 layer: upstream's Compressor, its hidden states of kv|score

    def compress(plan: Any, layer: int, kv_score_input: Any, **_: Any) -> Any:
        backend.forward_metadata = SimpleNamespace(c128_compress_metadata=plan,
                                                   core_metadata=SimpleNamespace(c128_out_loc=None))
        compressor, hidden = compressors[layer]
        batch = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False,
                                                             is_context_parallel_extend=lambda: False),
                                attn_cp_metadata=None)
        returned, calls = [], len(sim.ops.calls)
        compressor.compute_kv_score = lambda x, forward_batch: returned.append(
            type(compressor).compute_kv_score(compressor, x, forward_batch)) or returned[-1]
        try:
            # the model's forward runs under inference mode; the launch's parallel context (one GPU) is the one its
            # `get_parallel` reads (`compute_kv_score`'s prefill context-parallel check)
            with torch.no_grad(), mock.patch.object(rc, "_PARALLEL", launch_namespaces()["parallel"]):
                entry(hidden(kv_score_input), batch, layer_ids[layer], compressor)
        except _models.KernelCheck as exc:  # refused what upstream's compute_kv_score made: it is named
            got = sim.ops.calls[calls:][-1][1].get("kv_score_input") if sim.ops.calls[calls:] else None
            if "kv_score_input" not in str(exc) or not returned or got is not returned[-1]:
                raise
            raise Blame(f"{exc}: upstream's {type(compressor).__qualname__}.compute_kv_score returned a "
                        f"{returned[-1].dtype} {list(returned[-1].shape)} kv_score for a c128 layer (online "
                        f"compress on), which its compressor hands our verify compress as it is",
                        ours=_defined(_module(CONTROLLER)._verify_compress),
                        theirs=_defined(type(compressor).compute_kv_score)) from None
        finally:
            del compressor.compute_kv_score
        if len(stored) != 1:
            raise AssertionError(f"upstream's compressor stored {len(stored)} compressed rows for a c128 layer")
        return stored.pop()

    try:
        # the model of our op returns the plan type the compressor knows, as the op does (upstream code there may
        # look at the plan's type: helper 92's case 6)
        with _decode(on, True, _module(POOL).DeepSeekV4TokenToKVPool, comp.CompressorPrefillPlan) as sim, \
                _launch({ONLINE_ENV: "1"}):
            pool = backend.token_to_kv_pool = sim.backend.token_to_kv_pool  # upstream's class over the scenario's
            layer_ids[:] = [i for i, state in enumerate(pool.compress_state_pools) if state is not None]
            compressors[:] = [_tree_compressor(core, i, sim.apes[n], on) for n, i in enumerate(layer_ids)]
            pages = SimpleNamespace(page_size=1, kv_layout=getattr(getattr(comp, "KVLayout", None), "V4", None),
                                    get_key_buffer=lambda layer_id: torch.zeros(16, dtype=torch.uint8))
            pool.__dict__.update(uniform_fp8=False, layer_transfer_counter=None, start_layer=0,
                                 layer_mapping={i: (None, i, pages) for i in layer_ids})
            backend.online_c128_dspark, sim.compress = sim.controller, compress
            prefill = sim.ops.plan_type(128, torch.zeros(1, 16, dtype=torch.uint8), None, None)
            compress(prefill, 0, torch.zeros(1, 2 * HEAD_DIM))
            if upstream != [prefill] or sim.ops.calls:
                raise AssertionError("a prefill plan did not run upstream's compress_forward alone")
            if on:  # the compact verify graph the second step replays, captured at startup
                sim.capture(4, True)
            for slot, seq_len in zip(range(1, SLOTS), (1, 127, 128, 129, 255)) if on else ():
                sim.prefill(slot, seq_len)
            verifying.append(True)  # from here, every plan is a DSPARK verify plan
            for slots, padded_bs, extra, compact in ([1, 2, 3, 4, 5], 6, 0, False), ([2, 4], 4, 3, True):
                if on:  # a static verify (eager), then a compact one (a graph replay)
                    sim.step(slots, padded_bs, compact, extra, replay=compact)
    finally:
        comp.compress_forward, comp.compress_norm_rope_store = kernels


CORE_COMPRESSOR = "sglang.srt.layers.attention.dsv4.compressor"


def _tree_compressor(core: types.ModuleType, layer_id: int, ape: Any, on: bool) -> Tuple[Any, Any]:
    """Upstream's own c128 `Compressor` of layer ``layer_id`` (its `__init__`, on the CPU, tiny: hidden size
    ``2 * HEAD_DIM``; of its `DeepSeekV4Config`, which needs a checkpoint's quantization config, what it reads: the
    hidden size and the tree's defaults of the rest), its ape the scenario's, its `wkv_gate` weight a random signed
    permutation (bf16, exact), and the hidden states that its projection (`compute_kv_score`: `linear_bf16_fp32`,
    its CPU path) maps onto given kv|score rows exactly, so the step's rows are still checked against float64. Gates
    off, its `get_state_pool` stood in: the scenario's state pools are not the tree's there (its isinstance check)."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(_module(DSV4_CONFIG).DeepSeekV4Config)}
    config = SimpleNamespace(hidden_size=2 * HEAD_DIM, rms_norm_eps=defaults["rms_norm_eps"],
                             qk_rope_head_dim=defaults.get("qk_rope_head_dim", 64))  # what `__init__` reads
    compressor = core.Compressor(config, layer_id=layer_id, is_in_indexer=False, freqs_cis=None, compress_ratio=128,
                                 head_dim=HEAD_DIM, rotate=False)
    gen = torch.Generator().manual_seed(layer_id)
    perm = torch.randperm(2 * HEAD_DIM, generator=gen)
    sign = torch.randint(0, 2, (2 * HEAD_DIM,), generator=gen).float() * 2 - 1
    with torch.no_grad():
        compressor.ape.copy_(ape.float().view_as(compressor.ape))
        weight = compressor.wkv_gate.weight
        weight.zero_()
        weight[torch.arange(2 * HEAD_DIM), perm] = sign.to(weight.dtype)  # kv_score[:, i] = sign[i] * x[:, perm[i]]

    def hidden(rows: Any) -> Any:
        x = torch.empty_like(rows)
        x[:, perm] = rows * sign
        return x

    if not on:
        compressor.get_state_pool = lambda attn_backend: attn_backend.token_to_kv_pool.get_attention_compress_states(
            layer_id)
    return compressor, hidden


BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend"


def backend_verify_metadata(on: bool) -> None:
    """Upstream's target-verify metadata (`DeepseekV4AttnBackend.init_forward_metadata_target_verify`, static and
    compact, its instance made without `__init__` over the scenario's backend) leaves the c128 plan to the controller
    with the gates on: a plan of upstream's own there and the controller's verify plan is never built (the metadata
    takes the raw one first), so our kernels never run (helper 92's case 3). Stood in: `create_paged_compressor_data`
    (CUDA), which records that upstream planned. Gates off it is upstream's own path, with nothing of ours to check."""
    if not on:
        return
    mod, planned = _module(BACKEND), []
    kernels = mod.create_paged_compressor_data

    def plan(**kw: Any) -> Any:  # upstream's c128 plan: where it was asked for is the culprit
        caller = sys._getframe(1)
        name = getattr(caller.f_code, "co_qualname", caller.f_code.co_name)
        path = caller.f_code.co_filename
        planned.append(f"{caller.f_globals.get('__name__')}.{name} ({path[path.rfind('/sglang/') + 1:]}:"
                       f"{caller.f_lineno})")
        return SimpleNamespace(upstreams=True)

    mod.create_paged_compressor_data = plan
    try:
        with _decode(on, True, own_pool=False) as sim:
            backend = _bare(mod.DeepseekV4AttnBackend)
            rows = 4
            backend.__dict__.update(vars(sim.backend), present_ratios=(4, 128), has_c4=True, has_c128=True,
                                    needs_cpu_seq_lens=True,
                                    mtp_enabled=False, extend_seq_lens_buffer=torch.zeros(rows, dtype=torch.int32),
                                    extend_start_loc_buffer=torch.zeros(rows, dtype=torch.int32))
            backend.online_c128_mtp = mod.OnlineC128MTPController(backend)  # the one the backend makes
            layout = sim.ragged.RaggedVerifyLayout.from_verify_lens_device(
                verify_lens=torch.tensor([3, 1, 4, 2], dtype=torch.int32), graph_num_tokens=12)
            for ragged in (None, layout):
                with _launch({GATE_ENV: "1", ONLINE_ENV: "1"}):
                    raw = backend.init_forward_metadata_target_verify(
                        max_seq_len=512, req_pool_indices=torch.arange(rows), seq_lens=torch.tensor([130, 7, 255, 9]),
                        seq_lens_cpu=torch.tensor([130, 7, 255, 9]), out_cache_loc=torch.zeros(rows * W),
                        use_prefill_cuda_graph=False, online_c128_state_slot_offset=SLOTS + 2, ragged_layout=ragged)
                if raw.c128_compress_metadata is not None or planned:
                    raise AssertionError(f"upstream's target-verify metadata ({'compact' if ragged else 'static'}) "
                                         "holds a c128 plan of its own with the gates on (made in "
                                         f"{planned[0] if planned else 'no create_paged_compressor_data call'}): the "
                                         "controller's verify plan is never built")
    finally:
        mod.create_paged_compressor_data = kernels


WORKER, STREAMS_ENV = "sglang.srt.speculative.dspark_components.dspark_worker_v2", "SGLANG_DSPARK_RECORD_VERIFY_STREAMS"


_IN_PLACE = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
             "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"}


def _tree_caller() -> str:
    """The innermost frame of the tree (a module of ``sglang``) from our caller's outward: ``module.qualname
    (sglang/...py:line)``."""
    frame = sys._getframe(2)
    while frame is not None and not frame.f_globals.get("__name__", "").startswith("sglang."):
        frame = frame.f_back
    if frame is None:
        return "no frame of the tree"
    path, name = frame.f_code.co_filename, getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
    return f"{frame.f_globals['__name__']}.{name} ({path[path.rfind('/sglang/') + 1:]}:{frame.f_lineno})"


class _Streamed(torch.Tensor if torch else object):
    """A batch tensor recording its `record_stream` calls (on the CPU, as if it were CUDA) and the in-place writes
    into it (``writes``: (the tensor, the op, the tree's function that wrote it))."""

    is_cuda, records, writes = True, [], []

    def record_stream(self, stream: Any) -> None:
        _Streamed.records.append(self)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Tuple = (), kwargs: Optional[Dict] = None) -> Any:
        kwargs, name = kwargs or {}, getattr(func, "__name__", "")
        written = kwargs.get("out") if "out" in kwargs else args[0] if args and (
            name in _IN_PLACE or name.endswith("_") and not name.endswith("__")) else None
        if isinstance(written, _Streamed):
            cls.writes.append((written, name, _tree_caller()))
        return super().__torch_function__(func, types, args, kwargs)


def _with_stand_ins(fn: Any, **keep: Any) -> Any:
    """``fn`` over its module's globals, those it reads MagicMocks but for envs, torch and ``keep``. A decorated
    ``fn`` (``functools.wraps``'s ``__wrapped__``: ``@torch.no_grad()`` ...): its own body so, under the same
    decorators, each wrapper rebuilt over its own globals with its closure's cell of the function it wraps holding
    the rebuilt one; a wrapper that cannot be rebuilt so raises `HarnessError` (the scenario does not run the tree)."""
    layers = [fn]
    while hasattr(layers[-1], "__wrapped__") and len(layers) < 64:
        layers.append(layers[-1].__wrapped__)
    inner = layers[-1]
    if not isinstance(inner, types.FunctionType):
        raise HarnessError(f"the scenario harness (_with_stand_ins) cannot rebuild {_defined(fn)} over its "
                           f"stand-ins: its body is a {type(inner).__name__}, not a Python function")
    names, codes = set(), [inner.__code__]
    while codes:
        code = codes.pop()
        names |= set(code.co_names)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    ns = {**inner.__globals__,
          **{n: mock.MagicMock(name=n) for n in names & set(inner.__globals__) - {"envs", "torch"}}}
    made = _rebuilt(inner, {**ns, **keep}, inner.__closure__)
    for wrapper, wrapped in zip(reversed(layers[:-1]), reversed(layers[1:])):
        cells = (wrapper.__closure__ or ()) if isinstance(wrapper, types.FunctionType) else ()
        if not any(_holds(c, wrapped) for c in cells):
            raise HarnessError(f"the scenario harness (_with_stand_ins) cannot rebuild {_defined(fn)} over its "
                               f"stand-ins: its decorator's wrapper ({type(wrapper).__name__} "
                               f"{getattr(wrapper, '__qualname__', '?')}) holds the function it wraps other than in "
                               "its closure")
        made = _rebuilt(wrapper, wrapper.__globals__, tuple(
            types.CellType(made) if _holds(c, wrapped) else c for c in cells), __wrapped__=made)
    return made


def _holds(cell: Any, value: Any) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def _rebuilt(fn: Any, globals_: Dict[str, Any], closure: Optional[Tuple], **attrs: Any) -> Any:
    """``fn``'s code over ``globals_`` and ``closure``, its defaults, names and attributes (``attrs`` over them)."""
    out = types.FunctionType(fn.__code__, globals_, fn.__name__, fn.__defaults__, closure)
    out.__kwdefaults__, out.__qualname__, out.__module__ = fn.__kwdefaults__, fn.__qualname__, fn.__module__
    out.__dict__.update({**fn.__dict__, **attrs})
    return out


def _defined(obj: Any, line: Optional[int] = None) -> str:
    """``module.qualname (sglang/...py:line)`` of a function or class of the tree (a decorated one: its own
    source); ``line``: a line inside it instead of its first."""
    obj = inspect.unwrap(obj) if callable(obj) and not isinstance(obj, type) else obj
    try:
        path, first = inspect.getsourcefile(obj), inspect.getsourcelines(obj)[1]
    except (OSError, TypeError):
        return f"{obj.__module__}.{obj.__qualname__} (no source)"
    return f"{obj.__module__}.{obj.__qualname__} ({path[path.rfind('/sglang/') + 1:]}:{line or first})"


class Blame(AssertionError):
    """A scenario's finding where no frame of the tree is in the traceback (something did not happen): ``ours`` and
    ``theirs`` name our definition and the upstream one involved, as `culprit` names them from frames."""

    def __init__(self, message: str, *, ours: str, theirs: str, values: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.ours, self.theirs, self.values = ours, theirs, values or {}  # values: as a `KernelCheck`'s


def _upstream_callees(fn: Any) -> List[Any]:
    """The tree's functions of other modules that ``fn`` (ours) calls by a global name: the upstream helpers it
    delegates to."""
    found = [fn.__globals__.get(name) for name in fn.__code__.co_names]
    return [f for f in found if callable(f) and getattr(f, "__module__", "").startswith("sglang.")
            and f.__module__ != fn.__module__]


# the branches of the worker's accept (the tree's own: the eager accept, the verify graph's folded accept, the
# sampling-accept region replayed after a static verify graph): (name, compact, folded proposal, greedy sampling,
# verify epilogue, sampling region eligible)
ACCEPTS = [("eager accept, compact", True, False, True, False, False),
           ("eager accept, static", False, False, True, False, False),
           ("folded accept, compact", True, True, True, True, False),
           ("folded accept, static", False, True, True, True, False),
           ("sampling-accept region, static", False, True, False, True, True)]


def _worker_step(sim: Decode, compact: bool, attn_backend: Any, branch: Tuple = ACCEPTS[0]) -> Tuple[Any, List[Any]]:
    """One verify step of the tree's `DSparkWorkerV2._forward_decode`, its collaborators MagicMocks, the target's
    backend ``attn_backend``, the accept branch ``branch`` (`ACCEPTS`: its proposal, sampling, epilogue and region
    eligibility): (the batch, its events: accept, commit, commit_hidden in order, and last ("returned", the line the
    step returned from, its result, the accept, the in-place writes into the batch's `seq_lens` before the commit:
    (op, the tree's function)))."""
    _, _, folded, greedy, with_epilogue, region = branch
    draft_input, events, as64 = type("DFlashDraftInputV2", (), {}), [], lambda v: torch.tensor(v).as_subclass(_Streamed)
    layout = sim.ragged.RaggedVerifyLayout.from_verify_lens_device(
        verify_lens=torch.tensor([3, 1, 4], dtype=torch.int32), graph_num_tokens=12) if compact else None
    # the target's greedy predictions (zero drafts): 1, 0 and 1 drafts accepted, then the bonus token 5
    predict = torch.full((3, W), 5, dtype=torch.int64)
    predict[0, 0] = predict[2, 0] = 0
    correct = torch.tensor([1, 0, 1])
    out_tokens = torch.zeros(3, W, dtype=torch.int64).scatter_(1, correct[:, None], 5)
    accept = SimpleNamespace(new_seq_lens=torch.tensor([132, 8, 257]), commit_lens=torch.tensor([2, 1, 2]),
                             out_tokens=out_tokens, correct_len=correct,
                             cap_trim_lens=torch.zeros(3, dtype=torch.int32),
                             bonus=torch.full((3,), 5, dtype=torch.int64))  # the graphs' accept buffers
    worker = mock.MagicMock(name="worker", device="cpu", verify_num_draft_tokens=W, _verify_inputs_ready=None,
                            _prepare_inputs_once=False, _sim_draw_ahead=False, _simulate_acc_greedy=False,
                            _simulate_acc_len=-1.0, _draft_is_moe=False)  # (SGLANG_SIMULATE_ACC_LEN's default)
    worker._proposer.propose.return_value = SimpleNamespace(
        draft_block_ids=torch.zeros((3, 1), dtype=torch.int64), verify_ids=None, folded=folded, confidence=None,
        draft_block=SimpleNamespace(draft_tokens=torch.zeros((3, W - 1), dtype=torch.int64), greedy_mask=None),
        confidence_raw=None, draft_hidden=None, confidence_tap=None)
    planner, executor = worker._verify_planner, worker._verify_executor
    planner.schedule_layout.return_value, planner.should_run_compact.return_value = layout, compact
    planner.mode_value = "compact" if compact else "static"
    executor.verify_epilogue = mock.MagicMock(name="verify_epilogue", simulate_fold=False, future_relay=None) \
        if with_epilogue else None  # None: no in-graph accept
    verified = SimpleNamespace(logits_output=mock.MagicMock(name="logits_output", next_token_logits=torch.nn.functional
                                                            .one_hot(predict.view(-1), 8).float() * 100),
                               can_run_cuda_graph=True)
    executor.run_compact.return_value, executor.run_non_compact.return_value = (verified, None), verified
    worker._sampling_graph_eligible.return_value, worker._future_relay_in_graph.return_value = region, None
    # the tree's own accept (`TargetVerifyExecutor.accept_and_finalize`: eager, its kernels' CPU paths, but for a
    # sampled batch's draw, a triton kernel, stood in by the tree's greedy accept, which the peaked logits make the
    # same; folded, the verify graph's buffers, which the epilogue stands in for); the sampling-accept region is a
    # CUDA graph's replay
    verify = _module(VERIFY)
    drafts = verify.accept_draft_tokens
    tree = verify.TargetVerifyExecutor(
        target_worker=mock.MagicMock(name="target_worker"), gamma=W - 1, verify_num_draft_tokens=W,
        model_runner=mock.MagicMock(name="model_runner"), kv_injector=mock.MagicMock(name="kv_injector"),
        tp_sync=mock.MagicMock(name="tp_sync"))  # (one rank: the TP broadcast does nothing)
    tree.verify_epilogue = executor.verify_epilogue
    if with_epilogue:
        executor.verify_epilogue.read_accept.return_value = accept
    accepted: List[Any] = []

    def accept_and_finalize(**kw: Any) -> Any:
        events.append("accept")
        with contextlib.nullcontext() if greedy else mock.patch.object(
                verify, "accept_draft_tokens", lambda **k: drafts(**{**k, "sampling_info": None})):
            accepted.append(tree.accept_and_finalize(**kw))
        return accepted[-1]

    executor.accept_and_finalize.side_effect = accept_and_finalize
    worker._sampling_accept_graph.run.side_effect = lambda **kw: (events.append("accept"), accept)[1]
    executor.commit_hidden.side_effect = lambda **kw: events.append("commit_hidden")
    worker.target_worker.model_runner.attn_backend = attn_backend
    batch = mock.MagicMock(name="batch", seq_lens=as64([130, 7, 255]), req_pool_indices=as64([3, 1, 5]),
                           input_ids=as64([0]), out_cache_loc=as64([0]), has_grammar=False, return_logprob=False,
                           spec_info=mock.MagicMock(spec=draft_input),
                           sampling_info=mock.MagicMock(name="sampling_info", is_all_greedy=greedy,
                                                        is_any_greedy=greedy, need_top_k_sampling=False,
                                                        need_top_p_sampling=False, need_min_p_sampling=False))
    batch.forward_mode.is_idle.return_value = False
    commit, _Streamed.records[:], _Streamed.writes[:], written = sim.ops.dspark_commit, [], [], []

    def committed(*a: Any, **k: Any) -> Any:  # and what the step had written into the batch's tensors by then
        events.append("commit")
        written[:] = [(name, where) for t, name, where in _Streamed.writes if t is batch.seq_lens]
        return commit(*a, **k)

    sim.ops.dspark_commit = committed
    step = _with_stand_ins(_module(WORKER).DSparkWorkerV2._forward_decode, DFlashDraftInputV2=draft_input,
                           get_parallel=lambda: mock.MagicMock(attn_dp_enabled=False), GenerationBatchResult=dict)
    returned: List[int] = []

    def where(frame: Any, event: str, arg: Any) -> None:  # the line the step returned from
        if event == "return" and frame.f_code is inspect.unwrap(step).__code__:  # (its body, under decorators)
            returned.append(frame.f_lineno)

    sys.setprofile(where)
    try:
        result = step(worker, batch, None)
    finally:
        sys.setprofile(None)
    return batch, events + [("returned", returned[-1], result, accepted[-1] if accepted else accept, written)]


def worker_commit(on: bool) -> None:
    """The tree's DSPARK worker step over each branch of its accept (`ACCEPTS`): gates on, the controller commits
    right after accept (the step's pre-verify lengths, accepted lengths, slots, layout) before the step returns, and
    a backend with no controller fails the step; off, no commit. A branch that returns after accept without the
    commit (helper 97's case c9: an early return of the sampling-accept region) names the line it returned from; the
    eager branches run the tree's own accept, and a commit given other lengths than the pre-verify ones names the
    tree's function that wrote the batch's `seq_lens` in place (an accept advancing them), else the step."""
    for branch in ACCEPTS:
        name, compact = branch[:2]
        with _decode(on, True, own_pool=False) as sim:
            _, events = _worker_step(sim, compact, sim.backend, branch)
        (_, line, result, accept, written), events = events[-1], events[:-1]
        commits = [args for kind, args in sim.ops.calls if kind == "commit"]
        if not on and (commits or "commit" in events):
            raise AssertionError(f"the worker committed with the gates off ({name})")
        if on and (events[:2] != ["accept", "commit"] or len(commits) != 1):
            step = _module(WORKER).DSparkWorkerV2._forward_decode
            raise Blame(f"the worker's step ({name}) ran {events} and returned at line {line}: "
                        f"{len(commits)} commits, not a commit after accept",
                        ours=_defined(_module(CONTROLLER).commit_after_verify), theirs=_defined(step, line))
        if on:
            want = dict(seq_lens=[130, 7, 255], new_seq_lens=[132, 8, 257], req_pool_indices=[3, 1, 5],
                        verify_lens=[3, 1, 4] if compact else [W] * 3,
                        extend_start_loc=[0, 3, 4] if compact else [0, W, 2 * W])
            got = {k: commits[0][k].tolist() for k in want}
            if got["seq_lens"] != want["seq_lens"]:  # what the tree's accept (or step) left of the pre-verify lengths
                step = _module(WORKER).DSparkWorkerV2._forward_decode
                raise Blame(f"the commit after accept ({name}) got seq_lens {got['seq_lens']}, not the step's "
                            f"pre-verify {want['seq_lens']}" + (f": the batch's seq_lens were written in place "
                                                                f"({written[0][0]}) before it" if written else ""),
                            ours=_defined(_module(CONTROLLER).commit_after_verify),
                            theirs=written[0][1] if written else _defined(step))
            if got != want or commits[0]["num_q_tokens"] != (12 if compact else 3 * W):
                raise AssertionError(f"the commit after accept ({name}) got {got}, num_q_tokens "
                                     f"{commits[0]['num_q_tokens']}")
        if isinstance(result, dict) and result["new_seq_lens"] is not accept.new_seq_lens:  # (dict: ours stands in)
            raise AssertionError(f"the step's result ({name}) does not carry the accepted lengths")
    with _decode(on, True, own_pool=False) as sim:
        try:
            _worker_step(sim, True, type("TboAttnBackend", (), {})())  # two-batch overlap's wrapper backend
        except RuntimeError as exc:
            if not on or "no online c128 DSPARK controller" not in str(exc):
                raise
        else:
            if on:
                raise AssertionError("a target backend with no controller did not fail the step")


VERIFY, RECORD = "sglang.srt.speculative.dspark_components.dspark_verify", \
    "sglang.srt.speculative.dspark_components.c128_record_streams"


def _verify_step() -> Tuple[List[Any], List[Any]]:
    """The tree's `TargetVerifyExecutor._forward_prepared_verify` (its collaborators MagicMocks): (the tensors it
    recorded before `prepare_for_verify` rebinds the batch's, the verify inputs EAGLE's set names: the batch's four and
    the verify input's draft tokens, positions and mask)."""
    as_streamed = lambda *v: torch.tensor(v).as_subclass(_Streamed)  # noqa: E731
    batch = mock.MagicMock(name="batch", seq_lens=as_streamed(130, 7), req_pool_indices=as_streamed(3, 1),
                           input_ids=as_streamed(0, 0), out_cache_loc=as_streamed(0, 0))
    before: List[Any] = []

    def prepare_for_verify(batch_: Any, target_worker: Any) -> Tuple[Any, None]:
        before[:] = list(_Streamed.records)
        batch_.input_ids, batch_.out_cache_loc = torch.zeros(2 * W), torch.zeros(2 * W)  # upstream rebinds them
        return mock.MagicMock(name="verify_forward_batch"), None

    verify_input = SimpleNamespace(draft_token=as_streamed(*range(2 * W)), positions=as_streamed(*range(2 * W)),
                                   custom_mask=as_streamed(1, 1), live_seq_lens_cpu=torch.tensor([130, 7]),
                                   prepare_for_verify=prepare_for_verify)
    executor = mock.MagicMock(name="executor", verify_num_draft_tokens=W, _target_is_dsv41=False)
    want = [batch.seq_lens, batch.req_pool_indices, batch.input_ids, batch.out_cache_loc, verify_input.draft_token,
            verify_input.positions, verify_input.custom_mask]
    _Streamed.records[:] = []
    step = _with_stand_ins(_module(VERIFY).TargetVerifyExecutor._forward_prepared_verify)
    step(executor, batch=batch, verify_input=verify_input, seq_lens_cpu_backup=None, seq_lens_sum_backup=0)
    return before, want


def record_streams(on: bool) -> None:
    """The record_stream calls of the worker step (gate off, upstream's: seq_lens only; on, the decode inputs too)
    and of the verify step (`_forward_prepared_verify`; gate off none, on our `record_verify_inputs` through the
    tree's own helper: every verify input, before `prepare_for_verify` rebinds the batch's). A helper whose call no
    longer records (helper 97's case c4: it became a context manager) fails, naming it."""
    with _decode(on, False, own_pool=False) as sim, _launch({STREAMS_ENV: "1" if on else None}):
        batch, _ = _worker_step(sim, False, sim.backend)
    want = [batch.seq_lens] + ([batch.req_pool_indices, batch.input_ids, batch.out_cache_loc] if on else [])
    if [id(t) for t in _Streamed.records] != [id(t) for t in want]:
        raise AssertionError(f"{STREAMS_ENV} {'on' if on else 'off'}: {len(_Streamed.records)} record_stream calls, "
                             f"expected {len(want)} (seq_lens{', the verify inputs' if on else ''})")
    with _launch({STREAMS_ENV: "1" if on else None}):
        recorded, inputs = _verify_step()
    want = inputs if on else []
    if sorted(map(id, recorded)) != sorted(map(id, want)):
        names = "seq_lens, req_pool_indices, input_ids, out_cache_loc, draft_token, positions, custom_mask"
        said = (f"{STREAMS_ENV} {'on' if on else 'off'}: the verify step recorded {len(recorded)} tensors before "
                f"prepare_for_verify, expected {len(want)}{f' ({names})' if on else ''}")
        if not on:
            raise AssertionError(said)
        ours = _module(RECORD).record_verify_inputs
        helpers = _upstream_callees(ours)
        raise Blame(said, ours=_defined(ours),
                    theirs=_defined(helpers[0]) if helpers else "definition: none (it calls no upstream helper)")


SCENARIOS = {  # name -> function(gates on)
    "startup-rules": startup_rules,
    # static verify (a uniform batch padded to its bucket) -> accept -> commit after accept
    "verify-static": lambda on: _steps(on, False, [([1, 2, 3, 4, 5], 6, 0)]),
    # compact/ragged verify (a token bucket; padding rows of length 0) -> accept -> commit after accept
    "verify-compact": lambda on: _steps(on, True, [([1, 2, 3, 4, 5], 8, 3), ([2, 4], 2, 5)]),
    "decode": decode,
    "worker-commit": worker_commit,  # the worker's verify step: accept -> commit after accept
    "record-streams": record_streams,
    "compressor-callback": compressor_callback,  # upstream's compressor calls our compress_fn; the pool's getters
    "backend-verify-metadata": backend_verify_metadata,  # upstream's verify metadata leaves the c128 plan to ours
}


def _where(frame: Any, line: int, tree: str) -> str:
    name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
    return f"{frame.f_globals.get('__name__', '?')}.{name} ({frame.f_code.co_filename[len(tree) + 1:]}:{line})"


ASKED = "asked"  # ``_handed``'s key of the predicates our functions asked


def _handed(tree: str, ours: List[str]) -> Tuple[Any, Dict[int, List[Tuple[str, str]]]]:
    """A trace function recording the ints another module of the tree returns to a frame of our modules (a pool's
    getter to the controller ...): value -> [(the definition that returned it, its qualname)], so a kernel check
    refusing a value names where our code got it; and under ``ASKED`` the last bool each of our functions got from
    one (code -> (definition, qualname, value)), so a refusal our code raises on upstream's answer (helper 103's case
    c06: the tree's MTP controller says enabled for DSPARK, our startup check refuses both) names that predicate."""
    handed: Dict[int, List[Tuple[str, str]]] = {}
    asked: Dict[Any, Tuple[str, str, bool]] = {}
    handed[ASKED] = asked  # type: ignore[assignment]

    def ret(frame: Any, event: str, value: Any) -> Any:
        if event == "return" and type(value) in (int, bool):
            code = frame.f_code
            said = (_where(frame, code.co_firstlineno, tree), getattr(code, "co_qualname", code.co_name))
            if type(value) is int:
                handed.setdefault(value, []).append(said)
            elif frame.f_back is not None:  # a predicate: the last one each of our functions asked
                asked[frame.f_back.f_code] = (*said, value)
        return ret

    def call(frame: Any, event: str, arg: Any) -> Any:
        back, name = frame.f_back, frame.f_globals.get("__name__")
        if back is None or back.f_globals.get("__name__") not in ours or name == back.f_globals.get("__name__") \
                or not frame.f_code.co_filename.startswith(tree + os.sep):
            return None
        frame.f_trace_lines = False
        return ret

    return call, handed


def culprit(scenario: str, exc: BaseException, tree: str, ours: List[str],
            handed: Optional[Dict[int, List[Tuple[str, str]]]] = None) -> str:
    """What failed: our module's frame, the upstream definition involved, the scenario. A kernel check's refusal
    (the models' `KernelCheck`) names the tree's definition that handed our code the value refused (``handed``)."""
    frames = [(f, n) for f, n in traceback.walk_tb(exc.__traceback__) if f.f_code.co_filename.startswith(tree + os.sep)]
    mine = [_where(f, n, tree) for f, n in frames if f.f_globals.get("__name__") in ours]
    theirs = [_where(f, n, tree) for f, n in frames if f.f_globals.get("__name__") not in ours]
    if isinstance(exc, Blame):  # a scenario's finding: what it names
        mine, theirs = mine + [exc.ours], theirs + [exc.theirs]
    obj = getattr(exc, "obj", None) if isinstance(exc, AttributeError) else None
    if obj is not None and _upstreams(obj):  # an attribute our code reads on an upstream object (never one the
        # scenario made: the upstream function in the traceback, if any, is named then)
        cls = type(obj)
        try:
            where = f"{inspect.getsourcefile(cls)[len(tree) + 1:]}:{inspect.getsourcelines(cls)[1]}"
        except (OSError, TypeError):  # a class without Python source
            where = "no source"
        theirs.append(f"{cls.__module__}.{cls.__qualname__} ({where})")
    checked = isinstance(exc, _models.KernelCheck)  # raised as the kernel raises it: a RuntimeError
    said = f"{'AssertionError' if isinstance(exc, Blame) else 'RuntimeError'}: {exc}" if checked or isinstance(
        exc, Blame) else traceback.format_exception_only(type(exc), exc)[-1].strip()
    sources = [(k, v, (handed or {}).get(v)) for k, v in exc.values.items()] if checked or isinstance(
        exc, Blame) else []
    if any(where for _, _, where in sources):
        theirs.append(next(where[-1][0] for _, _, where in sources if where))
        said += " (" + "; ".join(f"{k} {v} as {where[-1][1]} returned it" for k, v, where in sources if where) + ")"
    line = linecache.getline(frames[-1][0].f_code.co_filename, frames[-1][1]).strip() if frames else ""
    asked = (handed or {}).get(ASKED, {}).get(frames[-1][0].f_code) if frames and not theirs else None
    if asked and frames[-1][0].f_globals.get("__name__") in ours and line.startswith("raise "):
        theirs.append(asked[0])  # our code refused on an upstream predicate's answer
        said += f" ({asked[1]} returned {asked[2]})"
    none = "definition: none in the traceback" + (f" (the failing line: {line})" if line else "")  # it names it
    return (f"scenario {scenario}: in {mine[-1] if mine else CONTROLLER + ' (its result)'}; upstream "
            f"{theirs[-1] if theirs else none}: {said}")


def _outcome(name: str, scenario: Any, on: bool, tree: str, ours: List[str]) -> Dict[str, str]:
    trace, handed = _handed(tree, ours)
    try:
        sys.settrace(trace)
        try:
            scenario(on)
        finally:
            sys.settrace(None)
        return {"status": "passed", "detail": ""}
    except NotRun as exc:
        return {"status": "not run", "detail": str(exc)}
    except Exception as exc:  # noqa: BLE001
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        if missing and missing.split(".")[0] != "sglang":  # a package the tree imports lazily, missing here
            where = [f.f_globals.get("__name__") for f, _ in traceback.walk_tb(exc.__traceback__)]
            return {"status": "not run", "detail": f"{where[-1]} did not import (needs {missing})"}
        frames = [(f, n) for f, n in traceback.walk_tb(exc.__traceback__)
                  if f.f_code.co_filename.startswith(tree + os.sep)]
        stale = _stale(exc, frames, tree) if not on else ""
        if stale:  # gates off our code is not run: the scenario's model of upstream is stale, not a finding
            return {"status": "not run", "detail": f"{stale} (upstream changed it; the scenario models the series' "
                                                   "base)"}
        harness = _harness(exc, frames)
        if harness:  # the scenario's machinery failed: the tree's code (ours too) was never on the stack
            return {"status": "not run", "detail": harness}
        return {"status": "failed", "detail": culprit(name, exc, tree, ours, handed)}


def _upstreams(obj: Any) -> bool:
    """Is ``obj`` of a class of the tree, not one the scenario made (its stand-in, a mock, a class of its own)?"""
    return not _stand_in(obj) and type(obj).__module__.split(".")[0] == "sglang"


def _harness(exc: BaseException, frames: List[Tuple[Any, int]]) -> str:
    """Where ``exc``, with no frame of the tree (``frames``) in its traceback, is the scenario harness's own error,
    not a finding: what it raised and where ("": a scenario's finding, an `AssertionError` or a kernel model's
    check, or an attribute the tree's object lacks, which `culprit` and `_stale` name)."""
    if frames or isinstance(exc, (AssertionError, _models.KernelCheck)) or exc.__traceback__ is None or (
            isinstance(exc, AttributeError) and _upstreams(getattr(exc, "obj", None))):
        return ""
    frame, line = list(traceback.walk_tb(exc.__traceback__))[-1]  # where it was raised
    code = frame.f_code
    return (f"the scenario harness failed, not the tree's code nor ours (no frame of the tree in its traceback): "
            f"{traceback.format_exception_only(type(exc), exc)[-1].strip()} (in "
            f"{getattr(code, 'co_qualname', code.co_name)}, {os.path.basename(code.co_filename)}:{line})")


def _stale(exc: BaseException, frames: List[Tuple[Any, int]], tree: str) -> str:
    """What of the scenario's model ``exc`` (gates off) shows stale: the tree reads a field the scenario's stand-in,
    made as the series' base has it, lacks; or the scenario reads one the tree's object no longer has (helper 99's
    c08, c11: upstream renamed it, the verdict's culprit is the contract's) ("": neither)."""
    obj = getattr(exc, "obj", None) if isinstance(exc, AttributeError) else None
    if obj is None or exc.__traceback__ is None:
        return ""
    last = list(traceback.walk_tb(exc.__traceback__))[-1][0].f_code.co_filename  # where it was raised
    scenario = os.path.dirname(last) == os.path.dirname(os.path.abspath(__file__))  # in a scenario or a model
    if _stand_in(obj) and frames and not scenario:
        return f"the scenario's stand-in {type(obj).__name__} has no {exc.name!r}, which " \
               f"{_where(*frames[-1], tree)} reads"
    if scenario and not _stand_in(obj):
        return f"the scenario reads {exc.name!r} on the tree's {type(obj).__module__}.{type(obj).__qualname__}, " \
               "which has none"
    return ""


def run(gates: str, tree: str, ours: List[str]) -> Dict[str, Dict[str, Any]]:
    """Each scenario with the gates ``gates`` ("on" / "off"), on the tree at ``tree`` (its ``python`` folder), with
    the seconds it took (ci/bench/bench_tier.py's profile)."""
    out = {}
    for name, scenario in SCENARIOS.items():
        started = time.perf_counter()
        out[name] = {**_outcome(name, scenario, gates == "on", tree, ours),
                     "seconds": round(time.perf_counter() - started, 3)}
    return out
