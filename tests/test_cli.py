"""The `geomjax` command's option handling: nothing here runs an experiment."""

from dataclasses import dataclass

import pytest

from geomjax._cli import main
from geomjax.experiments import ExperimentOptionError, check_options, experiments
from geomjax.experiments._common import gains_like, with_options


def test_list_shows_the_options_each_experiment_takes(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "spherical-pendulum" in out and "options: --dt, --t-final, --gains" in out
    assert len(experiments()) == len(out.splitlines()) - sum('options:' in line for line in out.splitlines())


def test_reproduce_help_names_the_options_and_who_takes_them(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["reproduce", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--all" in out and "--quick" in out and "--t-final" in out
    assert "  spherical-pendulum: --dt, --t-final, --gains\n" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["reproduce", "damped-foucault", "--gains", "5"],
         "experiment 'damped-foucault' does not take --gains; it accepts: --t-final"),
        (["reproduce", "pendulum-dirac", "--dt", "0.1"], "'pendulum-dirac' does not take --dt; it accepts: no options"),
        (["reproduce", "spherical-pendulum", "--dt", "-1"], "--dt must be a positive finite number, got '-1'"),
        (["reproduce", "spherical-pendulum", "--gains", "50,x"], "--gains must be a number, got 'x'"),
        (["reproduce", "--all", "--dt", "1e-3"], "with --all the options go to every experiment"),
        (["reproduce"], "give one experiment NAME or --all"),
        (["reproduce", "spherical", "--quick"], "unknown experiment 'spherical'; valid names:"),
        # refused by the experiment's setup before anything is compiled
        (["reproduce", "suslov", "--gains", "1,2", "--out", "{tmp}"],
         "experiment 'suslov': --gains takes 1 or 3 values here (one per gain), got 2"),
    ],
)
def test_bad_options_are_usage_errors_naming_the_experiment(argv, expected, capsys, tmp_path):
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert expected in err, err


def test_check_options_parses_and_refuses():
    assert check_options("spherical-pendulum", {"dt": "1e-3", "gains": "50,40,30,20", "t_final": None}) == {
        "dt": 1e-3,
        "gains": (50.0, 40.0, 30.0, 20.0),
    }
    with pytest.raises(ExperimentOptionError, match="'kepler' does not take --dt; it accepts: --t-final"):
        check_options("kepler", {"dt": 0.1})


@dataclass(frozen=True)
class _Setup:
    dt: float = 1e-3
    steps: int = 100_000
    save_every: int = 10
    gains: tuple = (10.0, 10.0, 10.0)


def test_with_options_keeps_the_horizon_and_shapes_the_gains():
    assert with_options(_Setup(), dt=1e-2) == _Setup(dt=1e-2, steps=10_000)
    short = with_options(_Setup(), t_final=0.013)  # 13 steps: rounded to one save interval of 10
    assert (short.steps, short.save_every) == (10, 10)
    tiny = with_options(_Setup(), t_final=0.004)  # shorter than a save interval: the stride shrinks
    assert (tiny.steps, tiny.save_every) == (4, 4)
    assert with_options(_Setup(), gains=(5.0,)).gains == (5.0, 5.0, 5.0)
    assert gains_like(50.0, (7.0,)) == 7.0
    with pytest.raises(ExperimentOptionError, match="takes 1 or 3 values here"):
        with_options(_Setup(), gains=(1.0, 2.0))
