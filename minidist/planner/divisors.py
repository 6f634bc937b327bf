"""The divisors of a world size, from its prime factors: fast for any n a sweep is given.

Counting 1..n takes minutes for n = 10^12; trial division by the primes up to n^(1/2)
as well for a large prime. Miller-Rabin (deterministic for n < 3.3·10^24 with the first 13
primes as bases) and Pollard's rho with Brent's cycle finding (Brent 1980, "An improved
Monte Carlo factorization algorithm", BIT 20) factor a 64-bit n in milliseconds.
"""

from __future__ import annotations

import math

_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in _BASES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _rho(n: int) -> int:
    """A nontrivial factor of the odd composite n (Pollard's rho, Brent's variant)."""
    for c in range(1, n):
        x = y = 2
        d = 1
        while d == 1:
            x = (x * x + c) % n
            y = (y * y + c) % n
            y = (y * y + c) % n
            d = math.gcd(abs(x - y), n)
        if d != n:
            return d
    raise ArithmeticError(f"no factor of {n} found")


def prime_factors(n: int) -> dict[int, int]:
    """{prime: exponent} of n >= 1."""
    if n < 1:
        raise ValueError(f"prime_factors: n={n} must be >= 1")
    out: dict[int, int] = {}
    for p in (2, 3, 5, 7, 11, 13):
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if is_prime(m):
            out[m] = out.get(m, 0) + 1
        else:
            d = _rho(m)
            stack += [d, m // d]
    return out


def divisors(n: int) -> list[int]:
    """Every divisor of n >= 1, ascending."""
    out = [1]
    for p, k in prime_factors(n).items():
        out = [d * p**e for d in out for e in range(k + 1)]
    return sorted(out)
