"""Where the time of a benchmark case goes: the operators of one forward+backward, per variant.

Usage: python tools/profile_bench.py CASE L [--batch B] [--threads T] [--keep-denormals] [--top N]
  CASE: a case of posenc_lit.bench (floor, shaw, huang4, huang4-unclipped, t5, tupe, alibi, rope, deberta, t5-module)
Prints, for each variant of the case, the operators with the most self CPU time (torch.profiler key_averages,
after one warm-up step), as a Markdown table: the shares say where a variant's time goes; absolute times on a
shared machine do not mean much. Used to explain the targets that `posenc_lit bench` misses (issue 12).
"""
import argparse, sys
import torch
from torch.profiler import profile, ProfilerActivity
from posenc_lit.bench import term_cases, hf_cases, _quiet_fd2


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('case'); ap.add_argument('L', type=int)
    ap.add_argument('--batch', type=int, default=8); ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--keep-denormals', action='store_true'); ap.add_argument('--top', type=int, default=8)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(not a.keep_denormals)
    hf = ('deberta', 't5-module')
    if a.case not in ('floor', 'shaw', 'huang4', 'huang4-unclipped', 't5', 'tupe', 'alibi', 'rope') + hf:
        sys.exit(f'no case {a.case!r}; cases: floor shaw huang4 huang4-unclipped t5 tupe alibi rope deberta t5-module')
    built = hf_cases(a.L, a.batch) if a.case in hf else term_cases(a.L, a.batch, compiled=False)   # only the family it is in
    cases = [c for c in built if c.name == a.case]
    c = cases[0]
    print(f'## {c.name} at L={a.L}, b={a.batch}, h=12, d=64, {a.threads} threads, subnormals '
          f'{"kept" if a.keep_denormals else "flushed"}: {c.note}\n')
    for v in c.variants:
        c.step(v)                                                      # warm-up
        with _quiet_fd2(), profile(activities=[ProfilerActivity.CPU]) as p: c.step(v)
        ev = [e for e in p.key_averages() if e.self_cpu_time_total > 0]
        total = sum(e.self_cpu_time_total for e in ev)
        print(f'### {v}: {total / 1e3:.0f} ms self CPU in all\n\n| operator | calls | self ms | share |\n|---|---|---|---|')
        for e in sorted(ev, key=lambda e: -e.self_cpu_time_total)[:a.top]:
            print(f'| {e.key} | {e.count} | {e.self_cpu_time_total / 1e3:.1f} | {e.self_cpu_time_total / total:.0%} |')
        print()


if __name__ == '__main__':
    main()
