"""RE2 syntax -> a POSIX extended regular expression over UTF-8 bytes, for glibc's regex.h.

RegexFullMatch's native kernel matches with glibc's `regcomp`/`regexec` in the "C"
locale, where the engine sees bytes. This translator turns an RE2 pattern (what ONNX
specifies) into an ERE with the same full-match language over UTF-8 text:

- every code point set (a literal, `.`, `[...]`, `\\d`, `[[:alpha:]]`, case folding under
  `(?i)`) becomes an alternation of UTF-8 byte sequences, so `.` matches one code point,
  not one byte, and classes may hold non-ASCII members or be negated;
- `\\d \\w \\s \\b` are ASCII, as in RE2; `(?:...)`, named groups and `(?flags)` are
  rewritten (i: case folding by expansion, s: `.` matches newline, U: accepted);
- lazy quantifiers (`*?`, `+?`, `??`, `{n,m}?`) become greedy: a full match is a yes/no
  question, and greediness only changes which submatch is reported, never whether the
  whole text matches.

What RE2 refuses (backreferences, lookaround, possessive quantifiers, bad escapes) and
what POSIX cannot express here (`(?m)`, Unicode classes `\\p{..}`, `\\C`, a NUL in the
pattern) raise a KilnError naming the construct. Texts holding NUL bytes or invalid UTF-8
can differ from RE2 (which matches an invalid byte as U+FFFD).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

MAX_CP = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
MAX_REPEAT = 1000  # RE2's limit
_ERE_SPECIAL = set(".[]()*+?{}|^$\\")


class RegexError(ValueError):
    """A pattern this translator refuses; the message names the construct."""


# ---- code point sets: sorted, merged, inclusive ranges ----

def _norm(ranges) -> tuple:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def _negate(ranges) -> tuple:
    out, prev = [], 0
    for lo, hi in _norm(ranges):
        if lo > prev:
            out.append((prev, lo - 1))
        prev = hi + 1
    if prev <= MAX_CP:
        out.append((prev, MAX_CP))
    return _norm(out)


def _valid(ranges) -> tuple:
    """Without the surrogates (not encodable in UTF-8) and NUL (not in a C pattern)."""
    out = []
    for lo, hi in _norm(ranges):
        for a, b in ((lo, min(hi, SURROGATES[0] - 1)), (max(lo, SURROGATES[1] + 1), hi)):
            a = max(a, 1)
            if a <= b:
                out.append((a, b))
    return _norm(out)


@functools.lru_cache(maxsize=1)
def _simple_folds() -> dict[int, frozenset]:
    """Code point -> its case-folding orbit: the code points joined to it by single-code-
    point lower/upper mappings (k, K and the Kelvin sign; s, S and long s), as RE2 folds."""
    parent: dict[int, int] = {}

    def find(a):
        while parent.get(a, a) != a:
            a = parent[a]
        return a
    for c in range(0x20000):
        if SURROGATES[0] <= c <= SURROGATES[1]:
            continue
        for m in (chr(c).lower(), chr(c).upper()):
            if len(m) == 1 and ord(m) != c:
                ra, rb = find(c), find(ord(m))
                if ra != rb:
                    parent[ra] = rb
    orbits: dict[int, set] = {}
    for c in list(parent):
        orbits.setdefault(find(c), set()).add(c)
    for r, members in orbits.items():
        members.add(r)
    return {m: frozenset(ms) for ms in orbits.values() for m in ms}


def _fold(ranges) -> tuple:
    folds = _simple_folds()
    extra = []
    for lo, hi in _norm(ranges):
        if hi - lo > 20000:
            raise RegexError("a case-insensitive class spanning more than 20000 code points")
        for c in range(lo, hi + 1):
            extra += [(m, m) for m in folds.get(c, ())]
    return _norm(list(ranges) + extra)


# ---- code point sets -> UTF-8 byte sequences -> ERE ----

def _encode(c: int) -> bytes:
    return chr(c).encode("utf-8")


def _utf8_sequences(lo: int, hi: int):
    """Byte-range sequences [(b0lo, b0hi), ...] matching exactly the UTF-8 of [lo, hi]
    (the split RE2 and Go's utf8 range compiler use)."""
    if lo > hi:
        return
    for limit in (0x7F, 0x7FF, 0xFFFF):
        if lo <= limit < hi:
            yield from _utf8_sequences(lo, limit)
            yield from _utf8_sequences(limit + 1, hi)
            return
    if hi < 0x80:
        yield [(lo, hi)]
        return
    n = len(_encode(lo))
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                yield from _utf8_sequences(lo, lo | m)
                yield from _utf8_sequences((lo | m) + 1, hi)
                return
            if hi & m != m:
                yield from _utf8_sequences(lo, (hi & ~m) - 1)
                yield from _utf8_sequences(hi & ~m, hi)
                return
    a, b = _encode(lo), _encode(hi)
    yield [(a[k], b[k]) for k in range(n)]


_BRACKET_SPECIAL = {ord("]"), ord("["), ord("-"), ord("^")}


def _bracket(byte_ranges) -> str:
    """An ERE bracket (or a single literal) matching the bytes in `byte_ranges`. The bytes
    that are special inside brackets are written as collating symbols ([.-.]), so no
    ordering rule of the bracket syntax can misread them."""
    rs = _norm(byte_ranges)
    if len(rs) == 1 and rs[0][0] == rs[0][1]:
        return _literal_byte(rs[0][0])
    items, specials = [], []
    for lo, hi in rs:
        start = lo
        for c in range(lo, hi + 2):
            if c > hi or c in _BRACKET_SPECIAL:
                if start <= c - 1:
                    a, b = start, c - 1
                    items.append(chr(a) if a == b else chr(a) + "-" + chr(b) if b > a + 1 else chr(a) + chr(b))
                if c <= hi:
                    specials.append(f"[.{chr(c)}.]")
                start = c + 1
    return "[" + "".join(specials + items) + "]"


def _literal_byte(b: int) -> str:
    ch = chr(b)
    return "\\" + ch if ch in _ERE_SPECIAL else ch


def _set_to_ere(ranges, what: str) -> str:
    ranges = _valid(ranges)
    if not ranges:
        raise RegexError(f"{what} matches no character")
    seqs = [s for lo, hi in ranges for s in _utf8_sequences(lo, hi)]
    singles = [s[0] for s in seqs if len(s) == 1]
    alts = [_bracket(singles)] if singles else []
    # group multi-byte sequences by their leading byte ranges to keep the ERE short
    alts += ["".join(_bracket([r]) for r in s) for s in seqs if len(s) > 1]
    return alts[0] if len(alts) == 1 and len(seqs[0]) == 1 else "(" + "|".join(alts) + ")"


def _class(ranges, negated: bool, flags) -> tuple:
    """A class's ranges: folded under (?i), then negated if asked (RE2's order)."""
    rs = _fold(ranges) if flags.i else _norm(ranges)
    return _negate(rs) if negated else rs


# ---- the parser ----

_PERL = {"d": ((0x30, 0x39),), "s": ((9, 10), (12, 13), (32, 32)),
         "w": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))}
_POSIX = {"alnum": ((0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A)), "alpha": ((0x41, 0x5A), (0x61, 0x7A)),
          "ascii": ((0, 0x7F),), "blank": ((9, 9), (32, 32)), "cntrl": ((0, 0x1F), (0x7F, 0x7F)),
          "digit": ((0x30, 0x39),), "graph": ((0x21, 0x7E),), "lower": ((0x61, 0x7A),),
          "print": ((0x20, 0x7E),), "punct": ((0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E)),
          "space": ((9, 13), (32, 32)), "upper": ((0x41, 0x5A),),
          "word": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
          "xdigit": ((0x30, 0x39), (0x41, 0x46), (0x61, 0x66))}
_SIMPLE_ESCAPES = {"a": 7, "f": 12, "t": 9, "n": 10, "r": 13, "v": 11}


@dataclass
class _Flags:
    i: bool = False
    s: bool = False


class _Parser:
    def __init__(self, pattern: str):
        self.p = pattern
        self.k = 0

    def fail(self, what: str):
        raise RegexError(f"{what} (at offset {self.k} of {self.p!r})")

    def peek(self, n: int = 1) -> str:
        return self.p[self.k:self.k + n]

    def eat(self, s: str) -> bool:
        if self.p.startswith(s, self.k):
            self.k += len(s)
            return True
        return False

    # alt := concat ('|' concat)*
    def alt(self, flags: _Flags) -> str:
        branches = [self.concat(flags)]
        while self.eat("|"):
            branches.append(self.concat(flags))
        return "|".join(branches)

    def concat(self, flags: _Flags) -> str:
        out = []
        while self.k < len(self.p) and self.peek() not in "|)":
            if self.peek() == "(" and self.peek(2) == "(?" and self._flag_group(flags):
                continue  # (?flags) changes flags for the rest of this group
            atom, width = self.atom(flags)
            out.append(self.quantified(atom, width))
        return "".join(out) if out else "()"

    def _flag_group(self, flags: _Flags) -> bool:
        """Consume `(?flags)` (no colon); False when the group is another kind."""
        j = self.k + 2
        while j < len(self.p) and self.p[j] in "imsU-":
            j += 1
        if j < len(self.p) and self.p[j] == ")":
            self._apply_flags(self.p[self.k + 2:j], flags)
            self.k = j + 1
            return True
        return False

    def _apply_flags(self, spec: str, flags: _Flags):
        on = True
        if not spec or spec.endswith("-") or spec.count("-") > 1:
            self.fail(f"bad flag group (?{spec})")
        for c in spec:
            if c == "-":
                on = False
            elif c == "m":
                if on:
                    self.fail("the multi-line flag (?m) has no POSIX equivalent here")
            elif c == "i":
                flags.i = on
            elif c == "s":
                flags.s = on
            elif c != "U":
                self.fail(f"unknown flag {c!r}")

    def quantified(self, atom: str, width: bool) -> str:
        q = ""
        while True:
            c = self.peek()
            if c in ("*", "+", "?"):
                self.k += 1
                op = c
            elif c == "{":
                op = self._interval()
                if op is None:
                    break
            else:
                break
            if q:
                self.fail("bad repetition operator: a repetition of a repetition")
            if not width:
                self.fail("a repetition of an empty-width assertion")
            q = op
            self.eat("?")  # lazy: the same full-match language
            if self.peek() == "+":
                self.fail("a possessive quantifier, which RE2 does not allow")
        return atom + q

    def _interval(self):
        j = self.p.find("}", self.k)
        body = self.p[self.k + 1:j] if j > 0 else ""
        parts = body.split(",")
        if j < 0 or not (1 <= len(parts) <= 2) or not parts[0].isdigit() or \
                (len(parts) == 2 and parts[1] and not parts[1].isdigit()):
            return None  # not a repetition: RE2 reads `{` literally
        lo = int(parts[0])
        hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
        if lo > MAX_REPEAT or (hi is not None and (hi > MAX_REPEAT or hi < lo)):
            self.fail(f"bad repetition {{{body}}} (RE2 allows counts up to {MAX_REPEAT}, min <= max)")
        self.k = j + 1
        return f"{{{lo}}}" if len(parts) == 1 else f"{{{lo},{'' if hi is None else hi}}}"

    def atom(self, flags: _Flags) -> tuple[str, bool]:
        """(ERE text of one atom, whether it consumes text)."""
        c = self.p[self.k]
        if c == "(":
            return self.group(flags), True
        if c == "[":
            return _set_to_ere(self.char_class(flags), "the class"), True
        self.k += 1
        if c == ".":
            return _set_to_ere(((0, MAX_CP),) if flags.s else _negate(((10, 10),)), "."), True
        if c == "^":
            return "^", False
        if c == "$":
            return "$", False
        if c in "*+?":
            self.fail(f"missing argument to repetition operator {c}")
        if c == "\\":
            return self.escape(flags)
        return self.literal(ord(c), flags), True

    def literal(self, cp: int, flags: _Flags) -> str:
        if cp == 0:
            self.fail("a NUL character, which a POSIX pattern cannot hold")
        if flags.i and cp in _simple_folds():
            return _set_to_ere(_fold(((cp, cp),)), "the literal")
        data = _encode(cp)
        text = "".join(_literal_byte(b) for b in data)
        return text if len(data) == 1 else "(" + text + ")"

    def group(self, flags: _Flags) -> str:
        self.k += 1  # (
        inner = _Flags(flags.i, flags.s)
        if self.eat("?"):
            if self.eat("P<") or (self.peek() == "<" and self.peek(2) not in ("<=", "<!") and self.eat("<")):
                end = self.p.find(">", self.k)
                if end < 0 or not self.p[self.k:end].replace("_", "a").isalnum():
                    self.fail("a bad group name")
                self.k = end + 1
            elif self.peek() in ("=", "!") or self.peek(2) in ("<=", "<!"):
                self.fail("lookaround, which RE2 does not allow")
            elif self.eat(":"):
                pass
            else:
                j = self.k
                while j < len(self.p) and self.p[j] in "imsU-":
                    j += 1
                if j >= len(self.p) or self.p[j] != ":":
                    self.fail("an unknown group construct (?")
                self._apply_flags(self.p[self.k:j], inner)
                self.k = j + 1
        body = self.alt(inner)
        if not self.eat(")"):
            self.fail("missing )")
        return "(" + body + ")"

    def escape(self, flags: _Flags) -> tuple[str, bool]:
        if self.k >= len(self.p):
            self.fail("a trailing backslash")
        c = self.p[self.k]
        self.k += 1
        if c in "bB":
            return "\\" + c, False
        if c == "A":
            return "^", False
        if c == "z":
            return "$", False
        if c == "Q":
            end = self.p.find("\\E", self.k)
            end = len(self.p) if end < 0 else end
            text = "".join(self.literal(ord(ch), flags) for ch in self.p[self.k:end])
            self.k = min(end + 2, len(self.p))
            return ("(" + text + ")" if text else "()"), True
        self.k -= 1
        rs = self.class_escape(flags)
        if rs is not None:
            return _set_to_ere(rs, f"\\{c}"), True
        return self.literal(self.char_escape(), flags), True

    def class_escape(self, flags: _Flags):
        """Ranges of a Perl class escape at the cursor (\\d \\D \\s \\S \\w \\W), or None.
        Under (?i) the positive class is folded before a negation, as RE2 does."""
        c = self.peek()
        if c.lower() in _PERL:
            self.k += 1
            return _class(_PERL[c.lower()], c.isupper(), flags)
        if c in "pP":
            self.fail(f"the Unicode class \\{c}, which this translator does not support")
        return None

    def char_escape(self) -> int:
        """The code point of a character escape at the cursor (after the backslash)."""
        c = self.p[self.k]
        self.k += 1
        if c in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[c]
        if c == "x":
            if self.eat("{"):
                end = self.p.find("}", self.k)
                digits = self.p[self.k:end] if end > 0 else ""
                self.k = end + 1 if end > 0 else self.k
            else:
                digits = self.p[self.k:self.k + 2]
                self.k += 2
            try:
                v = int(digits, 16)
            except ValueError:
                self.fail(f"a bad hexadecimal escape \\x{digits}")
            if len(digits) == 0 or v > MAX_CP or all(ch in "0123456789abcdefABCDEF" for ch in digits) is False:
                self.fail(f"a bad hexadecimal escape \\x{digits}")
            return v
        if c in "01234567":
            j = self.k
            while j < len(self.p) and j - self.k < 2 and self.p[j] in "01234567":
                j += 1
            if c != "0" and j == self.k:
                self.fail(f"a backreference \\{c}, which RE2 does not allow")
            v = int(c + self.p[self.k:j], 8)
            self.k = j
            return v
        if c.isascii() and not c.isalnum():
            return ord(c)
        self.fail(f"an invalid escape sequence \\{c}")

    def char_class(self, flags: _Flags) -> tuple:
        self.k += 1  # [
        negated = self.eat("^")
        ranges: list = []   # folded below under (?i)
        final: list = []    # negated members, already folded
        first = True
        while True:
            if self.k >= len(self.p):
                self.fail("missing ]")
            c = self.p[self.k]
            if c == "]" and not first:
                self.k += 1
                break
            first = False
            if c == "[" and self.peek(2) == "[:":
                end = self.p.find(":]", self.k + 2)
                name = self.p[self.k + 2:end] if end > 0 else ""
                neg = name.startswith("^")
                if end < 0 or name.lstrip("^") not in _POSIX:
                    self.fail(f"an unknown POSIX class [:{name}:]")
                rs = _POSIX[name.lstrip("^")]
                (final if neg else ranges).extend(_class(rs, neg, flags))
                self.k = end + 2
                continue
            if c == "\\":
                self.k += 1
                was = self.peek()
                rs = self.class_escape(flags)
                if rs is not None:
                    (final if was.isupper() else ranges).extend(rs)
                    continue
                if self.peek() in "pP":
                    self.fail("a Unicode class in brackets")
                lo = self.char_escape()
            else:
                lo = ord(c)
                self.k += 1
            hi = lo
            if self.peek() == "-" and self.peek(2) != "-]" and self.p[self.k + 1:self.k + 2] not in ("]", ""):
                self.k += 1
                if self.eat("\\"):
                    hi = self.char_escape()
                else:
                    hi = ord(self.p[self.k])
                    self.k += 1
                if hi < lo:
                    self.fail(f"a bad character class range {chr(lo)}-{chr(hi)}")
            ranges.append((lo, hi))
        ranges = _norm(list(_fold(ranges) if flags.i else ranges) + final)
        return _negate(ranges) if negated else ranges


def re2_to_ere(pattern: str) -> bytes:
    """The POSIX ERE (UTF-8 bytes, for regcomp with REG_EXTENDED in the C locale) whose
    match of a whole text is RE2's full match of `pattern`. Raises RegexError."""
    parser = _Parser(pattern)
    body = parser.alt(_Flags())
    if parser.k != len(pattern):
        parser.fail("unmatched )")
    return ("^(" + body + ")$").encode("latin-1")
