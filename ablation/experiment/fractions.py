"""Regular 2^(k-p) fractional factorials: generators, aliases, resolution, and the default choice.

Factors are lettered A, B, ... in spec order; the first k-p letters not generated form a full
factorial and each generator (``E=ABCD``) sets a factor to the product of others in -1/+1 coding.
The default generators are the minimum-aberration ones of `STANDARD_FRACTIONS`; `choose_fraction`
picks the fewest runs that reach a requested resolution (without one: the highest-resolution half
fraction, p = 1).
"""

from __future__ import annotations

import itertools
import math
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass

LETTERS = string.ascii_uppercase

STANDARD_FRACTIONS: dict[int, tuple[tuple[str, ...], ...]] = {
    3: (("C=AB",),),
    4: (("D=ABC",),),
    5: (("E=ABCD",), ("D=AB", "E=AC")),
    6: (("F=ABCDE",), ("E=ABC", "F=BCD"), ("D=AB", "E=AC", "F=BC")),
    7: (("G=ABCDEF",), ("F=ABCD", "G=ABDE"), ("E=ABC", "F=BCD", "G=ACD"), ("D=AB", "E=AC", "F=BC", "G=ABC")),
}
"""Minimum-aberration generators of 2^(k-p) fractions, by k, for p = 1, 2, ... (Montgomery, Design
and Analysis of Experiments, Table 8.14). Resolutions: k=3: III; k=4: IV; k=5: V, III; k=6: VI, IV,
III; k=7: VII, IV, IV, III (computed from the generators, see `Fraction.resolution`)."""

ROMAN = {1: "I", 2: "II", 3: "III", 4: "IV", 5: "V", 6: "VI", 7: "VII", 8: "VIII", 9: "IX", 10: "X"}


def roman(n: int) -> str:
    return ROMAN.get(n, str(n))


class DesignError(ValueError):
    """A design the factors cannot support; one sentence (spec.py prefixes the file and field)."""



@dataclass(frozen=True)
class Fraction:
    """A regular 2^(k-p) fraction given by p generators; factor i is letter LETTERS[i]."""

    k: int
    generators: tuple[tuple[int, int, frozenset[int]], ...]
    """(generated factor, sign +-1, word of base factors): x_generated = sign * prod(x_word) in -1/+1."""

    @property
    def p(self) -> int:
        return len(self.generators)

    @property
    def runs(self) -> int:
        return 2 ** (self.k - self.p)

    def generator_text(self) -> list[str]:
        return [
            f"{LETTERS[g]}={'-' if sign < 0 else ''}{''.join(LETTERS[i] for i in sorted(word))}"
            for g, sign, word in self.generators
        ]

    def defining_words(self) -> list[tuple[int, frozenset[int]]]:
        """Every non-identity word w with I = sign * w: the products of the generator words."""
        base = [(sign, word | {g}) for g, sign, word in self.generators]
        words = []
        for r in range(1, self.p + 1):
            for combo in itertools.combinations(base, r):
                sign, word = 1, frozenset()
                for s, w in combo:
                    sign, word = sign * s, word ^ w
                words.append((sign, word))
        return sorted(words, key=lambda sw: (len(sw[1]), sorted(sw[1])))

    @property
    def resolution(self) -> int:
        """Length of the shortest defining word: III aliases main effects with two-factor
        interactions, IV two-factor interactions with each other, V leaves both clear."""
        return min(len(word) for _, word in self.defining_words())

    def level_rows(self) -> list[tuple[int, ...]]:
        """The fraction's runs as 0/1 level tuples, one per run (factor order)."""
        generated = {g for g, _, _ in self.generators}
        base = [i for i in range(self.k) if i not in generated]
        cells = []
        for base_levels in itertools.product((-1, 1), repeat=len(base)):
            x = dict(zip(base, base_levels))
            for g, sign, word in self.generators:
                x[g] = sign * math.prod(x[i] for i in word)
            cells.append(tuple((x[i] + 1) // 2 for i in range(self.k)))
        return cells

    def alias_chains(self, names: Sequence[str]) -> list[str]:
        """The defining relation, then the alias chain of every main effect and two-factor
        interaction (each chain once), e.g. ``OF = CH:SP:TL:DS`` for E = ABCD."""

        def term(sign: int, word: frozenset[int]) -> str:
            return ("-" if sign < 0 else "") + ":".join(names[i] for i in sorted(word))

        words = self.defining_words()
        lines = ["I = " + " = ".join(term(s, w) for s, w in words)]
        seen: set[frozenset[int]] = set()
        for order in (1, 2):
            for effect in map(frozenset, itertools.combinations(range(self.k), order)):
                if effect in seen:
                    continue
                chain = sorted(((s, effect ^ w) for s, w in words), key=lambda sw: (len(sw[1]), sorted(sw[1])))
                seen.add(effect)
                seen.update(w for _, w in chain)
                lines.append(" = ".join([term(1, effect)] + [term(s, w) for s, w in chain]))
        return lines


_GENERATOR = re.compile(r"^\s*([A-Za-z])\s*=\s*([+-]?)\s*([A-Za-z]+)\s*$")


def parse_generators(texts: Sequence[str], k: int) -> Fraction:
    """`["E=ABCD"]` -> a Fraction over k factors, raising DesignError for a malformed set."""
    letters = LETTERS[:k]
    generators, generated = [], set()
    parsed = []
    for text in texts:
        match = _GENERATOR.match(text) if isinstance(text, str) else None
        if not match:
            raise DesignError(f"generator {text!r} is not of the form E=ABCD; write a factor letter, '=', and a product of letters")
        left, sign, word = match.group(1).upper(), match.group(2), match.group(3).upper()
        for letter in left + word:
            if letter not in letters:
                raise DesignError(f"generator {text!r} names {letter}, but the {k} factors are lettered A..{letters[-1]} in spec order; use those letters")
        if left in generated:
            raise DesignError(f"factor {left} is generated twice; give each generated factor one generator")
        generated.add(left)
        parsed.append((text, left, -1 if sign == "-" else 1, word))
    for text, left, sign, word in parsed:
        if len(set(word)) != len(word):
            raise DesignError(f"generator {text!r} repeats a letter; write each letter of the product once")
        if set(word) & generated:
            raise DesignError(f"generator {text!r} multiplies a generated factor; build words from the base factors only ({''.join(c for c in letters if c not in generated)})")
        generators.append((letters.index(left), sign, frozenset(letters.index(c) for c in word)))
    if not generators:
        raise DesignError("generators is empty; give at least one, e.g. E=ABCD, or leave it out for the standard fraction")
    fraction = Fraction(k, tuple(generators))
    if fraction.resolution < 3:
        raise DesignError(
            f"generators {', '.join(fraction.generator_text())} give resolution {roman(fraction.resolution)}, "
            "which aliases main effects with each other; use words of at least two letters that differ"
        )
    return fraction


def choose_fraction(k: int, resolution: int | None = None, generators: Sequence[str] | None = None) -> Fraction:
    """The fraction for k factors: the user's generators, else the fewest-run standard design
    reaching ``resolution`` (default: the half fraction, the highest resolution)."""
    if k < 3:
        raise DesignError(f"a fractional design needs at least 3 factors (got {k}); use design: full")
    if generators is not None:
        fraction = parse_generators(generators, k)
        if resolution is not None and fraction.resolution < resolution:
            raise DesignError(
                f"generators {', '.join(fraction.generator_text())} reach resolution {roman(fraction.resolution)}, "
                f"below the requested {roman(resolution)}; change the generators or the resolution"
            )
        return fraction
    if k not in STANDARD_FRACTIONS:
        raise DesignError(f"there is no built-in fraction for {k} factors; give generators (e.g. H=ABCDEFG) or use design: full")
    candidates = [parse_generators(g, k) for g in STANDARD_FRACTIONS[k]]
    if resolution is None:
        return candidates[0]
    reaching = [f for f in candidates if f.resolution >= resolution]
    if not reaching:
        best = candidates[0]
        raise DesignError(
            f"no 2^({k}-p) fraction of {k} factors reaches resolution {roman(resolution)} "
            f"(the best is {roman(best.resolution)}: {best.runs} runs, {', '.join(best.generator_text())}); "
            "lower the resolution or use design: full"
        )
    return min(reaching, key=lambda f: f.runs)

