"""The Flower adapter (bpfree.distributed.flower): the same weights as `bpfree fleet --federated`,
bit for bit, with only seeds and integer sums on the wire (issue 35)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

pytest.importorskip("flwr", reason="the optional 'flower' extra (make venv installs it)")

from bpfree.distributed.federated import run_federated  # noqa: E402
from bpfree.distributed.fleet import FleetOptions, build_setup, weights_digest  # noqa: E402
from bpfree.distributed.flower import (SeedClient, decode_record, encode_record,  # noqa: E402
                                       run_flower)
from bpfree.distributed.ledger import SeedLedger  # noqa: E402
from bpfree.perturb import derive_seed  # noqa: E402
from bpfree.pmt.trainer import PMTConfig  # noqa: E402

CLIENTS, ROUNDS = 3, 4


@pytest.fixture(scope="module")
def demo():
    """The demo model and data of `bpfree fleet` (its defaults, fewer queries)."""
    options = FleetOptions(queries=4, batch_size=16)
    setup = build_setup(options)
    config = PMTConfig(queries=options.queries, perturbation=options.perturbation,
                       seed=options.seed)
    return options, setup, config


def test_flower_reaches_the_fleets_federated_digest_and_ledger(demo, tmp_path):
    options, setup, config = demo
    header = {"method": "pmt", "clients": CLIENTS, "initial": weights_digest(setup["model"])}
    initial = weights_digest(setup["model"])
    fleet = run_federated(copy.deepcopy(setup["model"]), config, setup["x"], setup["y"],
                          clients=CLIENTS, rounds=ROUNDS, batch_size=options.batch_size,
                          lr=options.lr, ledger_path=tmp_path / "fleet.json", header=header)
    flower = run_flower(setup["model"], config, setup["x"], setup["y"], clients=CLIENTS,
                        rounds=ROUNDS, batch_size=options.batch_size, lr=options.lr,
                        ledger=SeedLedger(tmp_path / "flower.json", header))
    trained = weights_digest(fleet["replica"].trainer.model)
    assert trained != initial  # the rounds moved weights
    assert weights_digest(flower.replica.trainer.model) == trained
    assert flower.records == fleet["ledger"].records  # the same seeds, rates and sums
    assert (tmp_path / "flower.json").read_bytes() == (tmp_path / "fleet.json").read_bytes()
    assert flower.agree == [True] * ROUNDS  # every client holds the server's weights
    assert weights_digest(setup["model"]) == initial  # the caller's model is not trained


def test_a_client_sends_scalars_not_weights(demo):
    options, setup, config = demo
    client = SeedClient(1, setup["model"], config, setup["x"], setup["y"], clients=CLIENTS,
                        batch_size=options.batch_size)
    assert client.get_parameters({}) == []
    seed = derive_seed(options.seed, 0, 0)
    arrays, count, _ = client.fit([], {"round": 0, "seed": seed})
    layers = len(client.replica.wp)
    assert [a.dtype for a in arrays] == [np.int64]
    assert arrays[0].shape == (layers * options.queries + 1,)  # L·Q sums and the count
    assert count == options.batch_size == arrays[0][-1]
    weights = sum(p.numel() for p in client.replica.trainer.model.state_dict().values())
    assert arrays[0].size * 20 < weights
    with pytest.raises(ValueError, match="asked for round 3"):
        client.fit([], {"round": 3, "seed": seed})


def test_a_record_round_trips_exactly_and_a_bad_one_is_refused():
    record = {"round": 2, "seed": 2**32 - 1, "lr": 0.1 + 0.2, "count": 48,
              "sums": [-(2**62), 0, 2**62, 7]}
    assert decode_record(encode_record(record)) == record
    with pytest.raises(ValueError, match="int64 array"):
        decode_record(np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="int64 array"):
        decode_record(np.zeros(8, dtype=np.float64))


def test_bpfree_fleet_federated_flower_prints_the_same_digest(tmp_path, capsys):
    """`bpfree fleet --federated --flower` against `bpfree fleet --federated`: same server
    digest, same ledger; --flower alone is a usage error."""
    import json

    from bpfree.cli import main

    common = ["fleet", "--federated", "--clients", "2", "--rounds", "3", "--queries", "2",
              "--batch-size", "16"]
    docs = {}
    for name, extra in (("plain", []), ("flower", ["--flower"])):
        assert main([*common, *extra, "--ledger", str(tmp_path / f"{name}.ledger"),
                     "--json", str(tmp_path / f"{name}.json")]) == 0
        docs[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert docs["flower"]["transport"] == "flower"
    assert docs["flower"]["server_sha256"] == docs["plain"]["server_sha256"]
    assert docs["flower"]["late_client_agrees"]
    assert ((tmp_path / "flower.ledger").read_bytes()
            == (tmp_path / "plain.ledger").read_bytes())
    capsys.readouterr()
    assert main(["fleet", "--flower"]) == 2
    assert "--flower applies to --federated" in capsys.readouterr().err
