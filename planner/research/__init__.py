"""Research code about the dispatcher, kept off its import path: nothing in planner/balance imports it.

cross_bound.py certifies a lower bound on the inter-node bytes of any padded assignment under a
cost cap (bench/bench_padded_bound.py, tests/unit/test_balance_bound.py); karmarkar_karp.py is the
differencing reference bench/bench_balance.py measures the dispatcher against.
"""
