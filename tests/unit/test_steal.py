"""The hypervisor's steal share (runtime/profile/steal.py), read from /proc/stat's first line."""

from orch.runtime.profile.steal import cpu_jiffies, steal_share


def test_cpu_jiffies_reads_steal_and_the_total(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 5 20 800 10 0 5 60 7 0\ncpu0 50 2 10 400 5 0 2 30 3 0\n")
    assert cpu_jiffies(stat) == (60, 1000)  # guest time is already counted in user


def test_cpu_jiffies_is_none_where_the_kernel_does_not_say(tmp_path):
    assert cpu_jiffies(tmp_path / "missing") is None
    short = tmp_path / "short"
    short.write_text("cpu  100 5 20 800\n")  # a kernel without the steal column
    assert cpu_jiffies(short) is None


def test_steal_share_is_the_stolen_part_of_the_interval():
    assert steal_share((60, 1000), (110, 1200)) == 50 / 200
    assert steal_share((60, 1000), (60, 1400)) == 0.0
    assert steal_share(None, (60, 1000)) is None
    assert steal_share((60, 1000), (60, 1000)) is None  # no time passed


def test_this_machine_reports_a_share():
    first = cpu_jiffies()
    assert first is not None and first[1] > 0 and 0 <= first[0] <= first[1]
