"""Energy per unit of work, work per joule and the energy's price (issue 30), in the units cost
already uses; a run without energy gets none of them (never 0)."""

from __future__ import annotations

import pytest

from hopperlab.config.cost import CostSpec, price
from hopperlab.config.energy import (
    COST_ENERGY,
    energy_cost,
    energy_direction,
    energy_figures,
    energy_scope,
)
from hopperlab.backends.slurm.energy import parse_consumed_energy
from hopperlab.workloads import family_info


def units(family):
    return family_info(family).work_units


def test_training_tokens_per_joule_and_joules_per_million_tokens():
    # 600 W over a 10 s window at 12,000 tokens/s: 0.05 J a token, 20 tokens a joule
    m = {"energy_gpu_j": 6000.0, "energy_window_s": 10.0, "tokens_per_s": 12000.0}
    out = energy_figures(m, units("finetune"))
    assert out["energy_per_1m_train_tokens_j"] == pytest.approx(50_000.0)
    assert out["train_tokens_per_j"] == pytest.approx(20.0)
    assert "energy_node_per_1m_train_tokens_j" not in out  # the host was not measured


def test_host_energy_gives_the_node_figure():
    m = {"energy_gpu_j": 6000.0, "energy_host_j": 2000.0, "energy_window_s": 10.0,
         "tokens_per_s": 12000.0}
    out = energy_figures(m, units("finetune"))
    assert out["energy_node_per_1m_train_tokens_j"] == pytest.approx(800.0 / 12000.0 * 1e6)
    assert energy_scope(m) == "gpu+host"


def test_inference_units_generated_and_first_tokens():
    m = {"energy_gpu_j": 3000.0, "energy_window_s": 10.0, "decode_tokens_per_s": 50.0,
         "ttft_ms_p50": 200.0}
    out = energy_figures(m, units("inference"))
    assert out["energy_per_1m_generated_tokens_j"] == pytest.approx(300.0 / 50.0 * 1e6)
    assert out["energy_per_1k_first_tokens_j"] == pytest.approx(300.0 * 0.2 * 1e3)
    assert out["first_tokens_per_j"] == pytest.approx(5.0 / 300.0)


def test_recommendations_scale_by_top_n():
    m = {"energy_gpu_j": 1000.0, "energy_window_s": 5.0, "qps": 400.0}
    out = energy_figures(m, units("recommender"), {"top_n": 10})
    assert out["recommendations_per_j"] == pytest.approx(4000.0 / 200.0)


def test_database_queries_scanned_gb_and_the_duckdb_window():
    m = {"energy_gpu_j": 500.0, "energy_host_j": 100.0, "energy_window_s": 2.0,
         "q1_time_ms": 10.0, "q6_time_ms": 30.0, "q1_bytes_read": 4e9, "q6_bytes_read": 4e9,
         "q1_duckdb_ms": 100.0, "q6_duckdb_ms": 300.0,
         "duckdb_energy_gpu_j": 80.0, "duckdb_energy_host_j": 320.0, "duckdb_energy_window_s": 4.0}
    out = energy_figures(m, units("database"))
    # 2 queries in 40 ms at 250 W: 5 J a query
    assert out["energy_per_1k_queries_j"] == pytest.approx(5000.0)
    assert out["gb_scanned_per_j"] == pytest.approx(8.0 / (250.0 * 0.04))
    assert out["energy_node_per_1k_queries_j"] == pytest.approx(6000.0)
    # DuckDB: 2 queries in 400 ms at 100 W (GPU idle 20 W + host 80 W): 20 J a query
    assert out["energy_node_per_1k_duckdb_queries_j"] == pytest.approx(20_000.0)
    # the peer is not priced with the run's GPU hours
    figures, _ = price(m, 60.0, cost=CostSpec(per_gpu_hour=3.6), gpus=1,
                       units=units("database"))
    assert "cost_per_1k_duckdb_queries" not in figures and "cost_per_1k_queries" in figures


def test_the_duckdb_window_divides_its_own_joules_by_the_queries_it_ran():
    """Issue 36: the DuckDB peer's J per query = its window's joules / the queries the peer
    executed inside that window, beside the GPU side's, each from its own window."""
    m = {"energy_gpu_j": 500.0, "energy_window_s": 2.0, "q1_time_ms": 10.0, "q6_time_ms": 30.0,
         "measured_queries": 4.0, "q1_duckdb_ms": 100.0, "q6_duckdb_ms": 300.0,
         "duckdb_measured_queries": 8.0, "duckdb_energy_gpu_j": 80.0,
         "duckdb_energy_host_j": 320.0, "duckdb_energy_window_s": 4.0}
    out = energy_figures(m, units("database"))
    assert out["energy_per_1k_queries_j"] == pytest.approx(500.0 / 4.0 * 1e3)
    assert out["energy_per_1k_duckdb_queries_j"] == pytest.approx(80.0 / 8.0 * 1e3)
    assert out["energy_node_per_1k_duckdb_queries_j"] == pytest.approx(400.0 / 8.0 * 1e3)
    assert out["duckdb_queries_per_j"] == pytest.approx(8.0 / 80.0)


def test_membench_gb_copied_per_joule():
    m = {"energy_gpu_j": 900.0, "energy_window_s": 3.0, "gbps_at_largest": 50.0}
    out = energy_figures(m, units("membench"))
    assert out["gb_copied_per_j"] == pytest.approx(50.0 / 300.0)
    assert out["energy_per_tb_copied_j"] == pytest.approx(300.0 / 50.0 * 1000)


def test_unmeasured_energy_gives_no_figure_never_zero():
    m = {"energy_window_s": 10.0, "tokens_per_s": 12000.0}
    assert energy_figures(m, units("finetune")) == {}
    assert energy_figures({"energy_gpu_j": 0.0, "energy_window_s": 10.0,
                           "tokens_per_s": 1.0}, units("finetune")) == {}
    assert energy_scope(m) == "not measured"
    assert energy_cost(m, CostSpec(per_gpu_hour=1.0, per_kwh=0.2), units("finetune")) == {}


def test_a_site_prices_energy_per_kwh_as_a_line_of_its_own():
    m = {"energy_gpu_j": 3.6e6, "energy_host_j": 3.6e6, "energy_window_s": 3600.0,
         "tokens_per_s": 1000.0}
    m.update(energy_figures(m, units("finetune")))
    out = energy_cost(m, CostSpec(per_gpu_hour=2.0, per_kwh=0.25), units("finetune"))
    assert out[COST_ENERGY] == pytest.approx(0.5)  # 2 kWh
    assert out["cost_energy_per_1m_train_tokens"] == pytest.approx(
        m["energy_node_per_1m_train_tokens_j"] / 3.6e6 * 0.25)
    assert energy_cost(m, CostSpec(per_gpu_hour=2.0), units("finetune")) == {}
    with pytest.raises(ValueError):
        CostSpec(per_gpu_hour=2.0, per_kwh=-1.0)


def test_directions():
    assert energy_direction("energy_per_1m_train_tokens_j") == "lower"
    assert energy_direction("train_tokens_per_j") == "higher"
    assert energy_direction("energy_gpu_j") is None


def test_slurm_consumed_energy_zero_or_empty_is_not_collected():
    assert parse_consumed_energy("123456\n") == 123456.0
    assert parse_consumed_energy("0\n") is None
    assert parse_consumed_energy("\n") is None
    assert parse_consumed_energy("n/a") is None


def test_the_record_gets_energy_per_unit_and_its_price(tmp_path):
    from types import SimpleNamespace

    from hopperlab.run.annotate import annotate_record

    spec = SimpleNamespace(
        family="finetune", params={}, resources=SimpleNamespace(gpus=1),
        site=SimpleNamespace(machine="m", cost=CostSpec(per_gpu_hour=3.6, per_kwh=0.3)))
    rec = {"metrics": {"tokens_per_s": 1000.0, "energy_gpu_j": 7200.0, "energy_window_s": 12.0},
           "duration_s": 36.0, "tags": {}, "hardware": {}}
    annotate_record(rec, spec)
    m = rec["metrics"]
    assert m["train_tokens_per_j"] == pytest.approx(1000.0 / 600.0)
    assert m["cost_energy"] == pytest.approx(7200.0 / 3.6e6 * 0.3)
    assert rec["tags"]["cost.energy"] == "0.3 USD/kWh x gpu energy of the measured window"
    # a site without a price still gets the joules
    spec.site.cost = None
    rec = {"metrics": {"tokens_per_s": 1000.0, "energy_gpu_j": 7200.0, "energy_window_s": 12.0},
           "tags": {}, "hardware": {}}
    annotate_record(rec, spec)
    assert "energy_per_1m_train_tokens_j" in rec["metrics"] and "cost_energy" not in rec["metrics"]


def test_a_site_file_may_price_energy(tmp_path):
    import shutil
    from pathlib import Path

    from hopperlab.config.site import load_site

    root = Path(__file__).resolve().parents[2]
    shutil.copytree(root / "configs", tmp_path / "configs")
    shutil.copytree(root / "workflow" / "schemas", tmp_path / "workflow" / "schemas")
    path = tmp_path / "configs" / "sites" / "local.yaml"
    path.write_text(path.read_text().replace("currency: USD", "currency: USD, per_kwh: 0.2"))
    assert "per_kwh" in path.read_text()
    assert load_site(tmp_path, "local", str(tmp_path / "r")).cost.per_kwh == 0.2
