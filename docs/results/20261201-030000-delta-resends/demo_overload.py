"""make demo's traffic (link bytes a delivered report, seeds 7, 100, 200 and 300) and perf
overload's (orders p95, seeds 1-4, 4 minutes) on the virtual radio (perf/radio_sim).

    PYTHONPATH=<a tree's shim> python demo_overload.py
"""

from concurrent.futures import ProcessPoolExecutor

from c2dtn.perf import radio_sim


def demo(seed: int) -> str:
    r = radio_sim.demo(seed)
    return f"demo seed {seed}: {r['bytes_per_report']:.1f} B a delivered report, delay p95 {r['delay_p95_s']:.2f} s"


def overload(seed: int) -> str:
    r = radio_sim.overload(seed, minutes=4.0)
    return f"overload seed {seed}: orders p95 {r['order_p95_s']:.2f} s, position age p95 {r['aoi_p95_s']:.2f} s"


if __name__ == "__main__":
    with ProcessPoolExecutor(2) as ex:
        for line in ex.map(demo, [7, 100, 200, 300]):
            print(line, flush=True)
        for line in ex.map(overload, [1, 2, 3, 4]):
            print(line, flush=True)
