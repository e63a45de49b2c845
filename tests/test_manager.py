"""Plugin discovery through real entry points, guarded loading, block and allow lists, hooks
called through pluggy."""

import dataclasses
import subprocess
import sys

import pytest

from mmrope_core import PluginError, PluginLoadError, PluginLoadWarning, PluginManager, hookimpl
from mmrope_core.manager import PluginInfo


def by_name(manager):
    return {info.name: info for info in manager.plugins()}


def test_a_good_plugin_is_found_through_its_entry_point(toy_manager):
    toy = by_name(toy_manager)["toy"]
    assert toy.status == "active"
    assert (toy.distribution, toy.version) == ("mmrope-test-plugins", "1.0")
    assert toy.hooks == ("bind_rope_index", "example_cases", "get_rope_index_kwargs", "validate_inputs_policy", "varlen_keys")
    assert toy.processors == ("ToyProcessor",)


def test_a_plugin_that_fails_to_import_is_recorded_and_skipped(make_manager):
    manager = make_manager(MMROPE_LOAD_PLUGINS="toy,broken_import")
    with pytest.warns(PluginLoadWarning, match=r"broken_import \(mmrope-test-plugins 1.0\) failed to load: ModuleNotFoundError"):
        plugins = by_name(manager)
    assert plugins["broken_import"].status == "failed"
    assert "mmrope_dependency_that_is_not_installed" in plugins["broken_import"].reason
    assert plugins["toy"].status == "active"


def test_strict_mode_turns_a_load_failure_into_an_error_on_every_use(make_manager):
    manager = make_manager(MMROPE_LOAD_PLUGINS="toy,broken_import", MMROPE_STRICT_PLUGINS="1")
    for _ in range(2):  # not only the first time: the manager must not go on with what did load
        with pytest.raises(PluginLoadError, match="broken_import .*MMROPE_STRICT_PLUGINS") as caught:
            list(manager.results("varlen_keys", processor=object()))
        assert isinstance(caught.value.__cause__, ModuleNotFoundError)


def test_strict_mode_still_lists_every_plugin(make_manager):
    manager = make_manager(MMROPE_LOAD_PLUGINS="toy,broken_import", MMROPE_STRICT_PLUGINS="1")
    plugins = by_name(manager)
    assert plugins["broken_import"].status == "failed" and plugins["toy"].status == "active"


def test_a_hook_with_an_unknown_name_fails_validation(make_manager):
    manager = make_manager(MMROPE_LOAD_PLUGINS="unknown_hook")
    with pytest.warns(PluginLoadWarning, match="unknown hook.*bind_rope_indx"):
        info = by_name(manager)["unknown_hook"]
    assert info.status == "failed"
    assert "bind_rope_index" in info.reason  # lists the real hook names


def test_disabled_plugins_are_never_imported(make_manager):
    # mmrope_test_blocked raises on import: loading it would be a failure, not "disabled".
    manager = make_manager(MMROPE_DISABLE_PLUGINS="blocked,broken_import,unknown_hook")
    plugins = by_name(manager)
    assert plugins["blocked"].status == "disabled"
    assert plugins["blocked"].reason == "MMROPE_DISABLE_PLUGINS"
    assert "mmrope_test_blocked" not in sys.modules


def test_the_allowlist_loads_only_the_plugins_named(make_manager):
    plugins = by_name(make_manager(MMROPE_LOAD_PLUGINS="toy"))
    assert plugins["toy"].status == "active"
    assert {info.status for name, info in plugins.items() if name != "toy"} == {"disabled"}
    assert plugins["raises"].reason == "not in MMROPE_LOAD_PLUGINS"


def test_an_empty_allowlist_loads_no_plugin(make_manager):
    plugins = by_name(make_manager(MMROPE_LOAD_PLUGINS=""))
    assert plugins and {info.status for info in plugins.values()} == {"disabled"}


def test_entry_points_are_read_once_and_only_when_needed(make_manager, monkeypatch):
    import importlib_metadata

    calls = []
    real = importlib_metadata.entry_points
    monkeypatch.setattr(importlib_metadata, "entry_points", lambda **kw: calls.append(kw) or real(**kw))
    manager = make_manager(MMROPE_LOAD_PLUGINS="toy")
    assert calls == []
    manager.plugins()
    manager.plugins()
    assert calls == [{"group": "mmrope"}]


def test_importing_mmrope_core_loads_no_plugin():
    code = (
        "import sys, mmrope_core, mmrope_core.engine, mmrope_core.cli; "
        "print(sorted(m for m in sys.modules if m.startswith('mmrope_') and not m.startswith('mmrope_core')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_in_process_registration_always_unregisters(toy_manager):
    from mmrope_core import hookimpl

    class Plugin:
        @hookimpl
        def varlen_keys(self, processor):
            return ["extra"]

    with pytest.raises(RuntimeError):
        with toy_manager.registered(Plugin(), "notebook"):
            assert by_name(toy_manager)["notebook"].distribution is None
            raise RuntimeError("leave the block by an exception")
    assert "notebook" not in by_name(toy_manager)


def test_hooks_called_before_a_registration_see_it_after(toy_manager):
    from mmrope_core import hookimpl

    class Plugin:
        @hookimpl
        def varlen_keys(self, processor):
            return ["extra"]

    def answering():
        return sorted(info.name for info, _ in toy_manager.results("varlen_keys", processor=object()))

    before = answering()
    with toy_manager.registered(Plugin(), "notebook"):
        assert answering() == sorted([*before, "notebook"])
    assert answering() == before


def test_registering_a_name_twice_is_refused(toy_manager):
    with pytest.raises(PluginLoadError, match="already registered: toy \\(mmrope-test-plugins 1.0\\)"):
        toy_manager.register(object(), "toy")


def test_plugin_info_serialises_for_json():
    info = PluginInfo("x", "dist-x", "2.0", "failed", reason="ImportError: y")
    assert info.as_dict()["status"] == "failed"
    assert info.label == "x (dist-x 2.0)"


def test_hook_names_are_the_documented_ones():
    assert PluginManager.hook_names() == [
        "batch_layout", "bind_rope_index", "example_cases", "get_rope_index_kwargs", "validate_inputs_policy",
        "varlen_keys",
    ]


def test_core_works_with_no_plugin_at_all():
    code = (
        "import torch, mmrope_core as m;"
        "pm = m.PluginManager();"
        "assert [p.status for p in pm.plugins()] == ['disabled'] * len(pm.plugins());"
        "e = m.RopeEngine.from_processor(None, plugin_manager=pm);"
        "print(e.compute_position_ids(torch.tensor([[5, 6, 7]]), torch.tensor([[0, 1, 1]])).tolist())"
    )
    env = {**__import__("os").environ, "MMROPE_LOAD_PLUGINS": ""}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[0, 0, 1]]"


class Rewrapping:
    """A pluggy wrapper around every other plugin's binding."""

    @hookimpl(wrapper=True)
    def bind_rope_index(self, processor, config, options):
        binding = yield
        return None if binding is None else dataclasses.replace(binding, description="wrapped")


def test_a_wrapper_implementation_wraps_the_bindings_of_the_others(toy_manager):
    import mmrope_test_toy as toy

    from mmrope_core import RopeEngine

    with toy_manager.registered(Rewrapping(), "rewrapping"):
        engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager)
    assert engine.binding.description == "wrapped" and engine.plugin_name == "rewrapping"
    assert RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager).binding.description == "toy counting"


def test_a_wrapper_that_raises_is_named(toy_manager):
    import mmrope_test_toy as toy

    from mmrope_core import PluginHookError, RopeEngine

    class Raising:
        @hookimpl(wrapper=True)
        def bind_rope_index(self, processor, config, options):
            yield
            raise RuntimeError("wrapped wrong")

    with toy_manager.registered(Raising(), "raising_wrapper"), pytest.raises(PluginHookError) as caught:
        RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager)
    assert str(caught.value).startswith("plugin raising_wrapper (registered in-process) raised in hook bind_rope_index: "
                                        "RuntimeError: wrapped wrong")


def test_an_old_style_hook_wrapper_can_force_the_result(toy_manager):
    class Forcing:
        @hookimpl(hookwrapper=True)
        def varlen_keys(self, processor):
            outcome = yield
            outcome.force_result([*outcome.get_result(), ["forced"]])

    with toy_manager.registered(Forcing(), "forcing"):
        answers = toy_manager.results("varlen_keys", processor=object())
    assert ["forced"] in [result for _, result in answers]


def test_firstresult_hooks_stop_at_the_first_answer_and_tracing_sees_the_calls(toy_manager):
    import mmrope_test_toy as toy

    calls = []

    class Late:
        @hookimpl(trylast=True)
        def bind_rope_index(self, processor):
            calls.append("late")

    with toy_manager.registered(Late(), "late"):
        traced = []
        undo = toy_manager.pluggy.add_hookcall_monitoring(lambda name, impls, kwargs: traced.append(name),
                                                          lambda outcome, name, impls, kwargs: None)
        try:
            (info, binding), = toy_manager.results("bind_rope_index", processor=toy.ToyProcessor(), config=None,
                                                   options={})
        finally:
            undo()
    assert info.name == "toy" and calls == [] and traced == ["bind_rope_index"]


def test_two_plugins_claiming_one_processor_class_are_a_listed_conflict(toy_manager, capsys, monkeypatch):
    import mmrope_core.manager
    from mmrope_core import cli

    class Shadow:
        PROCESSOR_CLASSES = ("ToyProcessor",)

        @hookimpl(tryfirst=True)
        def bind_rope_index(self, processor):
            return None

    with toy_manager.registered(Shadow(), "shadow"):
        assert [info.name for info in toy_manager.conflicts()["ToyProcessor"]] == ["shadow", "toy"]
        monkeypatch.setattr(mmrope_core.manager, "_default_manager", toy_manager)
        assert cli.main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "conflict: ToyProcessor is claimed by shadow (registered in-process), toy (mmrope-test-plugins 1.0)" in out


def test_info_on_a_name_no_plugin_has_lists_the_names_seen(toy_manager):
    assert toy_manager.info("toy").name == "toy"
    with pytest.raises(PluginError, match=r"no mmrope plugin is named 'nope'; the plugins seen: .*'toy'"):
        toy_manager.info("nope")
