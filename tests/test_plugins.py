"""Schemes from a user's own file (positions/plugins.py), `relbench check` (relbench/contract/) and
`relbench new-variant`: templates that pass, broken schemes that fail on exactly their fault, a plugin
that trains, extrapolates and reports, a changed or missing plugin refused, and every bad input in
one line."""

import json
import sys
import textwrap

import pandas as pd
import pytest
from typer.testing import CliRunner

from relbench import contract, positions
from relbench.cli import app
from relbench.cli.templates import KINDS, template
from relbench.positions import forms, plugins

runner = CliRunner()
NO_FLEX = [name for name, _ in contract.PROPERTIES if name != "backend flex"]   # flex compiles: test_attention's


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(autouse=True)
def clean_registry():
    """Each test starts and ends with the built-in variants only, and nothing loaded."""
    plugins.forget()
    variants, form_names = set(positions.names()), set(forms.form_names())
    yield
    plugins.forget()
    assert set(positions.names()) == variants and set(forms.form_names()) == form_names
    contract.measure.cache_clear()


def fresh_process():
    """What a new `relbench` process knows: the built-ins only (a run then loads its own plugins)."""
    plugins.forget()


def write(path, text):
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def failed(spec):
    contract.measure.cache_clear()
    return {f.prop for f in contract.run(spec, NO_FLEX) if f.passed is False}


@pytest.mark.parametrize("kind", KINDS)
def test_every_template_passes_the_contract_as_written(kind, tmp_path):
    path = tmp_path / f"my_{kind.replace('-', '_')}.py"
    path.write_text(template(f"my-{kind}", kind))
    plugin = plugins.load_file(path)
    assert plugin.variants == (f"my-{kind}",) and len(plugin.sha256) == 64
    findings = contract.run(f"my-{kind}", NO_FLEX)
    assert [f for f in findings if f.passed is False] == []
    assert sum(f.passed is True for f in findings) >= 15


NONCAUSAL = '''
    import torch
    from relbench.positions import PositionEncoding, register
    from relbench.positions.plan import BiasPlan

    class AheadPlan(BiasPlan):
        """The template's per-key decay rate, but from the keys at and AFTER each key."""

        def __init__(self, k, q_len, k_len):
            super().__init__(k.shape[1], q_len, k_len)
            ahead = k.sum(-1).flip(-1).cumsum(-1).flip(-1) / k_len   # (B, H, L): future keys too
            self.rate = torch.nn.functional.softplus(ahead)

        def block(self, q_start, q_end, k_start, k_end):
            i = torch.arange(q_start, q_end)[:, None]
            j = torch.arange(k_start, k_end)[None, :]
            return -self.rate[..., None, k_start:k_end] * (i - j).clamp(min=0).float()

        @property
        def requires_grad(self):
            return self.rate.requires_grad

    @register("peeks")
    class Peeks(PositionEncoding):
        family, formula = "data-dependent bias", "b = -mean(k) * (i - j)"
        adds_bias, key_dependent, shared_across_layers = True, True, False

        def plan(self, q_len, k_len, q=None, k=None, x=None):
            return AheadPlan(k, q_len, k_len)
'''

ABSOLUTE = '''
    import torch
    from relbench.positions import PositionEncoding, register
    from relbench.positions.plan import BiasPlan

    class AbsolutePlan(BiasPlan):
        def block(self, q_start, q_end, k_start, k_end):
            i = torch.arange(q_start, q_end)[:, None].float()
            j = torch.arange(k_start, k_end)[None, :].float()
            return (-0.1 * (i - j) * (1 + 0.01 * j)).expand(self.n_heads, -1, -1)   # j: an absolute position

        @property
        def requires_grad(self):
            return False

    @register("absolute-claims-distance")
    class Claims(PositionEncoding):
        family, formula = "relative bias", "b = -0.1 (i - j) (1 + 0.01 j)"
        adds_bias, distance_only = True, True                         # the false declaration

        def plan(self, q_len, k_len, q=None, k=None, x=None):
            return AbsolutePlan(self.n_heads, q_len, k_len)
'''


def test_a_scheme_that_reads_future_keys_fails_causality_only(tmp_path):
    plugins.load_file(write(tmp_path / "peeks.py", NONCAUSAL))
    assert failed("peeks") == {"causal inside a GPT"}
    finding = contract.prop_causal("peeks")
    assert "max change of past logits from future tokens" in finding.evidence and "L=24" in finding.evidence
    assert float(finding.evidence.split("tokens ")[1].split(" at")[0]) > 1e-3


def test_absolute_positions_behind_a_distance_only_declaration_fail_translation_and_distance_only(tmp_path):
    plugins.load_file(write(tmp_path / "claims.py", ABSOLUTE))
    assert failed("absolute-claims-distance") == {"translation invariance", "distance_only"}
    finding = contract.prop_capability("absolute-claims-distance", "distance_only")
    assert finding.evidence == "declared True, behaves False" and finding.fix == "declare distance_only = False"


def test_a_capability_declared_but_lacking_fails_that_capability_only(tmp_path):
    text = template("lies", "bias").replace("    shared_across_layers = True", "    shared_across_layers = True\n"
                                             "    has_horizon = True   # false: log(1 + d) never turns constant")
    plugins.load_file(write(tmp_path / "lies.py", text))
    assert failed("lies") == {"has_horizon"}


def test_check_command_prints_the_table_and_exits_1_on_a_failure(tmp_path):
    path = write(tmp_path / "peeks.py", NONCAUSAL)
    result = run("check", path, "--only", "causal inside a GPT", "--only", "shapes")
    assert result.exit_code == 1
    assert "causal inside a GPT" in result.output and "FAIL" in result.output and "pass" in result.output
    assert "peeks: 1 of 2 properties failed (causal inside a GPT)" in result.output
    good = write(tmp_path / "fine.py", template("fine", "bias"))
    result = run("check", f"{good}:Fine", "--only", "shapes", "--only", "gradients")
    assert result.exit_code == 0, result.output
    assert "fine: all 2 properties that apply hold" in result.output
    assert run("check", "alibi", "--only", "shapes").exit_code == 0        # a registered variant by name


def test_new_variant_writes_a_file_and_refuses_to_overwrite(tmp_path):
    path = tmp_path / "myb.py"
    assert run("new-variant", "myb", "--out", path).exit_code == 0
    assert 'register("myb")' in path.read_text() and "relbench check" in path.read_text()
    again = run("new-variant", "myb", "--out", path)
    assert again.exit_code == 2 and "exists; pass --force" in again.output
    assert run("new-variant", "alibi", "--out", tmp_path / "a.py").exit_code == 2
    assert "lower case" in run("new-variant", "My Bias", "--out", tmp_path / "b.py").output
    assert 'unknown template kind "rotory"' in run("new-variant", "x", "--kind", "rotory").output


@pytest.mark.parametrize("text, message", [
    (None, "plugin file {path} not found"),
    ("import torch\nraise RuntimeError('boom at import')\n", "failed to import: RuntimeError: boom at import ({path}:2)"),
    ("def broken(:\n", "failed to import: SyntaxError: "),
    ("X = 1\n", "registers no position variant: decorate a PositionEncoding subclass"),
    ("from relbench.positions import RelativeBias, register\n@register('alibi')\nclass A(RelativeBias):\n"
     "    def distance_bias(self, d):\n        return d\n", 'registers "alibi", the name of a built-in position variant'),
    ("from relbench.positions.forms import Form, register_form\n@register_form('logn')\nclass L(Form):\n    pass\n",
     'registers "logn", the name of a built-in evaluation form'),
    ("from relbench.positions import register\n@register('plain')\nclass P:\n    pass\n",
     "which is not a subclass of PositionEncoding"),
])
def test_bad_plugins_are_one_line_and_exit_2_before_any_work(tmp_path, text, message):
    path = tmp_path / "bad.py"
    if text is not None:
        path.write_text(text)
    result = run("train", "--plugin", path, "--preset", "tiny", "--variants", "alibi", "--run-dir", tmp_path / "run")
    assert result.exit_code == 2, result.output
    assert message.format(path=path) in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()                                  # nothing done
    assert set(positions.names()) == set(plugins.builtin_names()) - set(forms.form_names())


def test_two_variants_need_a_class_name(tmp_path):
    two = template("one", "bias") + "\n\n" + template("two", "bias").split("from relbench.positions import RelativeBias")[1]
    path = write(tmp_path / "two.py", two.replace("class Two(RelativeBias)", "class Two(RelativeBias)"))
    result = run("check", path)
    assert result.exit_code == 2 and "registers 2 variants (one, two): name one" in result.output
    assert 'has no variant or class "Three"' in run("check", f"{path}:Three").output


def test_a_plugin_trains_extrapolates_and_reports_and_a_changed_file_is_refused(tmp_path):
    source = tmp_path / "elsewhere" / "mybias.py"
    source.parent.mkdir()
    source.write_text(template("mybias", "bias"))
    run_dir = tmp_path / "run"
    result = run("train", "--plugin", source, "--preset", "tiny", "--variants", "mybias", "alibi", "--steps", 30,
                 "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    config = json.loads((run_dir / "config.json").read_text())
    assert config["plugins"] == [{"path": str(source.resolve()), "sha256": plugins.digest(source),
                                  "variants": ["mybias"], "forms": []}]
    assert "plugins = [" in (run_dir / "config.toml").read_text()
    fresh_process()   # the run loads its own file
    result = run("extrapolate", "--run-dir", run_dir, "--lengths", 32, 64)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(run_dir / "extrapolation.csv")
    assert set(rows["variant"]) == {"mybias", "alibi"} and (rows["status"] == "ok").all()
    assert run("report", "--run-dir", run_dir).exit_code == 0
    assert "| mybias |" in (run_dir / "report.md").read_text()

    source.write_text(source.read_text().replace("* 0.5)", "* 0.25)"))   # an edit after training
    fresh_process()
    refused = run("extrapolate", "--run-dir", run_dir, "--lengths", 32)
    assert refused.exit_code == 2
    assert f"plugin {source.resolve()} changed since run {run_dir} was trained" in refused.output
    assert "--accept-plugin-change" in refused.output
    accepted = run("report", "--run-dir", run_dir, "--accept-plugin-change")
    assert accepted.exit_code == 0, accepted.output
    recorded = json.loads((run_dir / "config.json").read_text())["plugins"][0]
    assert recorded["sha256"] == plugins.digest(source) and recorded["previous"] == [config["plugins"][0]["sha256"]]

    moved = tmp_path / "moved.py"
    source.rename(moved)
    fresh_process()
    missing = run("report", "--run-dir", run_dir)
    assert missing.exit_code == 2 and "which is missing: restore it, or pass --plugin FILE if it moved" in missing.output
    assert run("report", "--run-dir", run_dir, "--plugin", moved).exit_code == 0   # the same bytes elsewhere


def test_an_experiment_file_names_plugins_relative_to_itself(tmp_path):
    (tmp_path / "schemes").mkdir()
    (tmp_path / "schemes" / "filebias.py").write_text(template("filebias", "bias"))
    experiment = write(tmp_path / "exp.toml", '''
        preset = "tiny"
        plugins = ["schemes/filebias.py"]
        variants = ["filebias"]
        [train]
        steps = 10
    ''')
    result = run("train", "--config", experiment, "--run-dir", tmp_path / "run", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "filebias" in result.output
    bad = write(tmp_path / "bad.toml", 'plugins = "schemes/filebias.py"\n')
    assert f"plugins in {bad} must be a list" in run("train", "--config", bad, "--dry-run").output


def test_an_installed_package_registers_through_its_entry_point(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "pkgbias-1.0.dist-info").mkdir(parents=True)
    (site / "pkgbias.py").write_text(template("pkgbias", "bias"))
    (site / "pkgbias-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: pkgbias\nVersion: 1.0\n")
    (site / "pkgbias-1.0.dist-info" / "entry_points.txt").write_text("[relbench.positions]\npkgbias = pkgbias\n")
    monkeypatch.syspath_prepend(str(site))
    found = plugins.load_installed()
    assert [p.variants for p in found] == [("pkgbias",)] and found[0].distribution == "pkgbias==1.0"
    assert plugins.records_for(["pkgbias:scale=2"]) == [{"entry_point": "pkgbias = pkgbias",
                                                         "distribution": "pkgbias==1.0", "variants": ["pkgbias"],
                                                         "forms": []}]
    assert plugins.load_installed() is found                               # once per process
    sys.modules.pop("pkgbias", None)


def test_an_evaluation_form_plugs_in_the_same_way(tmp_path):
    path = write(tmp_path / "half.py", '''
        from relbench.positions.forms import register_form
        from relbench.positions.forms import Form

        @register_form("half-temperature")
        class Half(Form):
            formula = "logits x 0.5"

            def logit_scale(self, enc, length):
                return 0.5
    ''')
    plugin = plugins.load_file(path)
    assert plugin.variants == () and plugin.forms == ("half-temperature",)
    assert forms.get_form("half-temperature").formula == "logits x 0.5"
    assert forms.parse_form("alibi@half-temperature") is not None
    assert "registers evaluation forms only" in run("check", path).output
