"""Values that cannot work are refused at config check, the limit named, before anything is built or
spins: infinite numbers, betas outside [0, 1), seeds numpy cannot take, sample indices larger than the
machine's memory, models beyond any device."""

from __future__ import annotations

import pytest
from nxd_train.cli import default_config_path, main


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.optim.lr=1e400", "model.optim.lr: expected a finite number, found inf"),
        ("model.optim.betas=[0.9,1.5]", "model.optim.betas[1]: expected a value < 1.0, found 1.5"),
        ("seed=1180591620717411303424", "seed: expected a value < 4294967296"),
        (
            "data.global_batch_size=1000000000",
            "300,000,000,000 samples; their index takes about 5,588 GiB, expected at most half of this machine's",
        ),
        ("trainer.max_steps=1000000000000000000", "8,000,000,000,000,000,000 samples"),
        ("model.hidden_size=1099511627776", "make about 7.3e+24 parameters; expected at most 1e+13"),
        ("model.num_layers=100000", "model.num_layers: expected at most 4096 decoder layers"),
    ],
)
def test_a_value_that_cannot_work_is_refused_at_config_check(override, message, capsys):
    assert main(["config", "check", str(default_config_path()), override]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
