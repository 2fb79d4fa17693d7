"""`tenantry simulate --replicas N --router POLICY` and the `[fleet]` table of a configuration file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tenantry.cli import main
from tenantry.model.config import ConfigError
from tenantry.runner.fleet import load_fleet_toml
from tenantry.runner.history import read_history
from tenantry.runner.setups import load_config_toml
from tenantry.spec.invariants_fleet import check_fleet_history
from conftest import REPO

EXAMPLE = REPO / "examples" / "fleet.toml"


def run_cli(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def workload(tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(
        f'{{"request_id":{i},"tenant":"{"ab"[i % 2]}","arrival_s":{i * 0.01:.2f},"prompt_tokens":{200 + 32 * (i % 3)},'
        f'"output_tokens":20,"prefix_ids":[{i % 3},{i % 3 + 10},{i % 3 + 20}]}}\n' for i in range(120)))
    return wl


def test_the_example_fleet_file_loads():
    fc = load_fleet_toml(EXAMPLE, load_config_toml(EXAMPLE))
    assert [c.num_blocks for c in fc.replicas] == [4096, 4096, 2048, 2048]
    assert (fc.router, fc.accounting, fc.load_factor) == ("prefix_affinity", "fleet", 1.25)


def test_simulate_a_fleet_per_router_prints_ttft_gap_and_hit_rate(tmp_path, capsys, workload):
    code, out, err = run_cli(["simulate", "--config", str(EXAMPLE), "--workload", str(workload),
                              "--router", "round_robin", "prefix_affinity", "--history",
                              str(tmp_path / "h.{policy}.jsonl")], capsys)
    assert code == 0, err
    rows = [l.split() for l in out.splitlines() if l.startswith("vtc+")]
    tenants = [(r[0], r[1]) for r in rows if r[1] in ("a", "b")]
    assert tenants == [("vtc+round_robin", "a"), ("vtc+round_robin", "b"),
                       ("vtc+prefix_affinity", "a"), ("vtc+prefix_affinity", "b")]
    fleet = {r[0]: r for r in rows if r[1] == "fleet"}
    hit = {k: float(v[3].rstrip("%")) for k, v in fleet.items()}
    assert hit["vtc+prefix_affinity"] > hit["vtc+round_robin"] > 0  # affinity keeps prefixes where they are cached
    assert sum(map(int, fleet["vtc+round_robin"][4:])) == 120  # requests per replica add up to the workload
    for name in ("vtc+round_robin", "vtc+prefix_affinity"):
        h = read_history(tmp_path / f"h.{name}.jsonl")
        assert len(h.header["fleet"]["replicas"]) == 4 and check_fleet_history(h) == []


def test_replicas_flag_without_a_fleet_table(capsys, workload):
    code, out, err = run_cli(["simulate", "--workload", str(workload), "--policy", "vtc", "--replicas", "3"], capsys)
    assert code == 0, err
    fleet = [l.split() for l in out.splitlines() if l.startswith("vtc+round_robin") and " replica " in l]
    assert len(fleet) == 1 and [int(x) for x in fleet[0][4:]] == [40, 40, 40]  # round robin, the default router


@pytest.mark.parametrize("flags, needle", [
    (["--replicas", "2", "--router", "nearest"], "--router='nearest': unknown router"),
    (["--router", "all", "least_kv"], "--router='all least_kv': give 'all' alone"),
    (["--replicas", "2", "--accounting", "fleet", "--policy", "fcfs"], "--accounting='fleet': fleet-level accounting"),
])
def test_bad_fleet_flags_are_one_line(capsys, workload, flags, needle):
    code, out, err = run_cli(["simulate", "--workload", str(workload)] + flags, capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("line, needle", [
    ("replicas = 0", "[fleet]: replicas=0: must be an integer from 1 to 1024"),
    ("replicas = 1000000", "[fleet]: replicas=1000000: must be an integer from 1 to 1024"),
    ("router = 'magic'", "[fleet]: router='magic': unknown router"),
    ("num_blocks = [4096, 4096]", "[fleet]: num_blocks=[4096, 4096]: give a list of 1 pool sizes"),
    ("colour = 1", "[fleet]: colour=1: unknown key"),
    ("load_factor = 0.5", "[fleet]: load_factor=0.5: must be a number >= 1"),
])
def test_bad_fleet_table_names_file_table_key_and_value(tmp_path, capsys, workload, line, needle):
    cfg = tmp_path / "f.toml"
    cfg.write_text(f"[fleet]\n{line}\n\n[[tenants]]\nname = 'a'\n\n[[tenants]]\nname = 'b'\n")
    code, out, err = run_cli(["simulate", "--config", str(cfg), "--workload", str(workload)], capsys)
    assert code == 2 and needle in err and str(cfg) in err and len(err.strip().splitlines()) == 1


def test_verify_history_judges_a_fleet_history(tmp_path, capsys):
    from tenantry.runner.fleet import simulate_fleet
    from tenantry.runner.history import write_history
    from tenantry.testing.mutants import FLEET_MUTANTS

    m = FLEET_MUTANTS["route_loses"]
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    write_history(simulate_fleet(m.fleet(), m.workload(), horizon_s=12), good)
    write_history(simulate_fleet(m.fleet(), m.workload(), horizon_s=12, variant=m.variant), bad)
    code, out, err = run_cli(["verify", "--history", str(good), "--out", str(tmp_path / "r1")], capsys)
    assert code == 0, err
    assert "replica 1: VTC-GAP" in out and "FLEET-NO-LOSS" in out and "0 findings" in out
    code, out, err = run_cli(["verify", "--history", str(bad), "--out", str(tmp_path / "r2")], capsys)
    assert code == 1 and "did not answer a request routed to it" in out and "300 findings" in out
    code, out, err = run_cli(["verify", "--history", str(good), "--config", str(EXAMPLE), "--out",
                              str(tmp_path / "r3")], capsys)
    assert code == 2 and "--config=" in err and len(err.strip().splitlines()) == 1


def test_replicas_below_one_names_the_same_limit(capsys, workload):
    for bad in ("-1", "0"):
        with pytest.raises(SystemExit) as e:
            main(["simulate", "--workload", str(workload), "--replicas", bad])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"'{bad}': must be >= 1" in err and len(err.strip().splitlines()) == 1


def test_verify_says_why_a_fleet_invariant_is_not_checked_and_refuses_a_replica_the_fleet_lacks(tmp_path, capsys,
                                                                                              workload):
    hist = tmp_path / "f.jsonl"
    code, out, err = run_cli(["simulate", "--workload", str(workload), "--replicas", "2", "--accounting", "fleet",
                              "--policy", "vtc", "--history", str(hist)], capsys)
    assert code == 0, err
    code, out, err = run_cli(["verify", "--history", str(hist), "--out", str(tmp_path / "r1")], capsys)
    assert code == 0, err
    # the default replica is not ample KV: FLEET-VTC-GAP is skipped, and the report says which replica and why
    assert "not checked: FLEET-VTC-GAP: skipped: replica 0 is not ample KV (SPEC.md 7.0: num_blocks=" in out
    assert "not checked: ROUTE-LOAD-BOUND: skipped: the router 'round_robin' is not load-bounded" in out
    lines = hist.read_text().splitlines()
    i = next(k for k, l in enumerate(lines) if '"kind":"request"' in l.replace(" ", "") and '"replica":1' in l)
    lines[i] = lines[i].replace('"replica":1', '"replica":9').replace('"replica": 1', '"replica": 9')
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    code, out, err = run_cli(["verify", "--history", str(bad), "--out", str(tmp_path / "r2")], capsys)
    assert code == 2 and "replica=9" in err and "replicas 0..1" in err and len(err.strip().splitlines()) == 1


def test_a_fleet_setup_keeps_its_fleet_when_a_flag_overrides_one_part(capsys, workload):
    """--policy fleet_rr --router least_kv runs fleet_rr's 4 replicas behind least_kv (a fresh
    user's run got one replica); --accounting alone keeps its router."""
    code, out, err = run_cli(["simulate", "--policy", "fleet_rr", "--router", "least_kv", "--workload",
                              str(workload)], capsys)
    assert code == 0, err
    assert "fleet: 4 replicas" in err and "fleet_rr+least_kv" in out
    row = next(line for line in out.splitlines() if line.startswith("fleet_rr+least_kv") and "replica " in line)
    assert row.split()[-5].endswith("%") and all(t.isdigit() for t in row.split()[-4:])  # 4 replicas' requests
    code, out, err = run_cli(["simulate", "--policy", "fleet_tenant_affinity", "--accounting", "fleet",
                              "--workload", str(workload)], capsys)
    assert code == 0, err
    assert "fleet: 4 replicas" in err
    assert any(line.split()[:2] == ["fleet_tenant_affinity", "fleet"] for line in out.splitlines())  # accounting


def test_one_fleet_line_for_several_alike_fleets_names_none_of_them(capsys, workload):
    """vtc and fcfs behind one router on the same 2 replicas: one 'fleet (each of the 2)' line, not a
    line headed by the first fleet's name as if it were the only one (a fresh user's reading)."""
    code, out, err = run_cli(["simulate", "--replicas", "2", "--router", "round_robin", "--policy", "vtc", "fcfs",
                              "--workload", str(workload)], capsys)
    assert code == 0, err
    heads = [line for line in err.splitlines() if line.startswith("fleet")]
    assert len(heads) == 1 and heads[0].startswith("fleet (each of the 2): 2 replicas"), heads


def test_a_fleet_table_and_fleet_setups_together_are_one_line_error(capsys, workload):
    code, out, err = run_cli(["simulate", "--config", str(EXAMPLE), "--policy", "fleet_rr", "fleet_tenant_affinity",
                              "--workload", str(workload)], capsys)
    assert code == 2 and err.count("\n") == 1 and "[fleet] table" in err and "fleet_rr" in err, err


def test_a_config_that_is_endless_or_not_utf8_is_one_line_error(tmp_path, capsys):
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'[replica]\nname = "caf\xe9"\n')
    code, _, err = run_cli(["simulate", "--config", str(latin)], capsys)
    assert code == 2 and err.count("\n") == 1 and "not UTF-8" in err and "latin.toml" in err, err
    code, _, err = run_cli(["simulate", "--config", "/dev/zero"], capsys)  # not a regular file: never read
    assert code == 2 and err.count("\n") == 1 and "/dev/zero: not a regular file or a pipe (a character device)" in err, err
    huge = tmp_path / "huge.toml"
    with open(huge, "wb") as f:  # sparse: read at most 1 MiB + 1 byte, then refused
        f.truncate((1 << 20) + 1)
    code, _, err = run_cli(["simulate", "--config", str(huge)], capsys)
    assert code == 2 and err.count("\n") == 1 and "huge.toml: larger than 1 MiB" in err, err


def test_replicas_beyond_the_cap_are_refused_before_anything_is_built(capsys):
    """--replicas 1000000 grew past 1.6 GB building replicas before it was refused."""
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--replicas", "1000000"])
    assert e.value.code == 2 and "at most 1024 replicas" in capsys.readouterr().err
