"""What the machine did to a measurement window, from /proc and /sys (overhead.py and its
worker): the CPUs' frequency, the time the hypervisor took from them (steal: a VM's cores run
another tenant's work), and the time a thread waited for a CPU. Each reading is None (or empty)
where the kernel does not offer it."""

USER_HZ = 100  # /proc/stat's unit (sysconf(_SC_CLK_TCK) on Linux)


def cpu_mhz(cpus):
    """Mean current frequency of `cpus` (cpufreq, else /proc/cpuinfo), or None."""
    vals = []
    for c in cpus:
        try:
            with open("/sys/devices/system/cpu/cpu%d/cpufreq/scaling_cur_freq" % c) as f:
                vals.append(int(f.read()) / 1000.0)
        except (OSError, ValueError):
            pass
    if not vals:
        try:
            with open("/proc/cpuinfo") as f:
                per, cpu = {}, None
                for line in f:
                    key, _, value = line.partition(":")
                    if key.strip() == "processor":
                        cpu = int(value)
                    elif key.strip() == "cpu MHz" and cpu is not None:
                        per[cpu] = float(value)
            vals = [per[c] for c in cpus if c in per]
        except (OSError, ValueError):
            pass
    return sum(vals) / len(vals) if vals else None


def cpu_times(cpus, text=None):
    """{cpu: (all jiffies, steal jiffies)} of `cpus` from /proc/stat (`text`: its content)."""
    if text is None:
        try:
            with open("/proc/stat") as f:
                text = f.read()
        except OSError:
            return {}
    out = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or len(fields) < 8:
            continue
        try:
            cpu, vals = int(name[3:]), [int(v) for v in fields[:8]]
        except ValueError:
            continue
        if cpu in cpus:
            out[cpu] = (sum(vals), vals[7])  # user nice system idle iowait irq softirq steal
    return out


def steal_pct(before, after):
    """The share of the CPUs' time between two cpu_times() readings that was stolen, in
    percent; None without both readings or with no time between them."""
    total = steal = 0
    for cpu, (t0, s0) in before.items():
        if cpu in after:
            total += after[cpu][0] - t0
            steal += after[cpu][1] - s0
    return 100.0 * steal / total if total > 0 else None


def thread_run_delay_ns():
    """The calling thread's time runnable but waiting for a CPU (schedstat), or None."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
