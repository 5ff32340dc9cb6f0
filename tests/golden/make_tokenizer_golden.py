#!/usr/bin/python3
"""Writes tests/fixtures/tokenizer_golden.jsonl: token ids for >= 2,000 lines from an
independent reference tokenizer, which the C++ tokenizer must reproduce exactly.

Reference: a pure-Python port of Hugging Face transformers' slow BertTokenizer
(transformers v4.4x: PreTrainedTokenizer.tokenize -> special-token split and
per-character lower-casing, BasicTokenizer with NFC, WordpieceTokenizer,
build_inputs_with_special_tokens, longest_first truncation, decode with
clean_up_tokenization_spaces). transformers itself is not installable here; the
port follows its algorithm line by line and uses Python's own `unicodedata`
(a different Unicode implementation than utf8proc, which the C++ side uses).

Run with /usr/bin/python3 (standard library only):
    /usr/bin/python3 tests/golden/make_tokenizer_golden.py
Inputs: tests/fixtures/bert-base-uncased-vocab.txt and tests/fixtures/corpus/**.txt.
"""
import collections
import glob
import hashlib
import json
import os
import random
import re
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
REFERENCE = "pure-Python port of transformers v4.4x BertTokenizer (slow), Python unicodedata"

# --- the reference tokenizer ------------------------------------------------


def load_vocab(path):
    vocab = collections.OrderedDict()
    with open(path, "r", encoding="utf-8") as reader:
        for index, token in enumerate(reader.readlines()):
            vocab[token.rstrip("\n")] = index
    return vocab


def whitespace_tokenize(text):
    text = text.strip()
    return text.split() if text else []


def is_whitespace(char):
    if char in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(char) == "Zs"


def is_control(char):
    if char in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(char).startswith("C")


def is_punctuation(char):
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def is_chinese_char(cp):
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


class BasicTokenizer:
    def __init__(self, do_lower_case=True, never_split=None, tokenize_chinese_chars=True,
                 strip_accents=None):
        self.do_lower_case = do_lower_case
        self.never_split = set(never_split or [])
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.strip_accents = strip_accents

    def tokenize(self, text, never_split=None):
        never_split = self.never_split.union(set(never_split)) if never_split else self.never_split
        text = self.clean_text(text)
        if self.tokenize_chinese_chars:
            text = self.split_chinese_chars(text)
        text = unicodedata.normalize("NFC", text)
        split_tokens = []
        for token in whitespace_tokenize(text):
            if token not in never_split:
                if self.do_lower_case:
                    token = token.lower()
                    if self.strip_accents is not False:
                        token = self.run_strip_accents(token)
                elif self.strip_accents:
                    token = self.run_strip_accents(token)
            split_tokens.extend(self.run_split_on_punc(token, never_split))
        return whitespace_tokenize(" ".join(split_tokens))

    @staticmethod
    def run_strip_accents(text):
        text = unicodedata.normalize("NFD", text)
        return "".join(c for c in text if unicodedata.category(c) != "Mn")

    @staticmethod
    def run_split_on_punc(text, never_split=None):
        if never_split is not None and text in never_split:
            return [text]
        output = []
        start_new_word = True
        for char in text:
            if is_punctuation(char):
                output.append([char])
                start_new_word = True
            else:
                if start_new_word:
                    output.append([])
                start_new_word = False
                output[-1].append(char)
        return ["".join(x) for x in output]

    @staticmethod
    def split_chinese_chars(text):
        return "".join(" " + c + " " if is_chinese_char(ord(c)) else c for c in text)

    @staticmethod
    def clean_text(text):
        output = []
        for char in text:
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or is_control(char):
                continue
            output.append(" " if is_whitespace(char) else char)
        return "".join(output)


class WordpieceTokenizer:
    def __init__(self, vocab, unk_token, max_input_chars_per_word=100):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word

    def tokenize(self, text):
        output_tokens = []
        for token in whitespace_tokenize(text):
            chars = list(token)
            if len(chars) > self.max_input_chars_per_word:
                output_tokens.append(self.unk_token)
                continue
            is_bad = False
            start = 0
            sub_tokens = []
            while start < len(chars):
                end = len(chars)
                cur_substr = None
                while start < end:
                    substr = "".join(chars[start:end])
                    if start > 0:
                        substr = "##" + substr
                    if substr in self.vocab:
                        cur_substr = substr
                        break
                    end -= 1
                if cur_substr is None:
                    is_bad = True
                    break
                sub_tokens.append(cur_substr)
                start = end
            if is_bad:
                output_tokens.append(self.unk_token)
            else:
                output_tokens.extend(sub_tokens)
        return output_tokens


class BertTokenizer:
    """PreTrainedTokenizer.tokenize + BertTokenizer._tokenize and friends."""

    SPECIALS = ["[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]"]

    def __init__(self, vocab_file, do_lower_case=True, strip_accents=None):
        self.vocab = load_vocab(vocab_file)
        self.ids_to_tokens = {i: t for t, i in self.vocab.items()}
        self.do_lower_case = do_lower_case
        self.basic = BasicTokenizer(do_lower_case=do_lower_case, strip_accents=strip_accents)
        self.wordpiece = WordpieceTokenizer(self.vocab, "[UNK]")
        self.special_ids = {self.vocab[t] for t in self.SPECIALS}

    def split_on_special_tokens(self, text):
        # transformers' Trie.split: leftmost-longest matches of the added tokens.
        pattern = "(" + "|".join(re.escape(t) for t in self.SPECIALS) + ")"
        return [p for p in re.split(pattern, text)]

    def tokenize(self, text):
        if self.do_lower_case:
            # Lower-cases every non-special character on its own (no final-sigma
            # context), exactly as PreTrainedTokenizer.tokenize does.
            escaped = [re.escape(t) for t in self.SPECIALS]
            pattern = r"(" + r"|".join(escaped) + r")|" + r"(.+?)"
            text = re.sub(pattern, lambda m: m.groups()[0] or m.groups()[1].lower(), text)
        out = []
        for chunk in self.split_on_special_tokens(text):
            if not chunk:
                continue
            if chunk in self.SPECIALS:
                out.append(chunk)
                continue
            out.extend(self._tokenize(chunk))
        return out

    def _tokenize(self, chunk):
        """BertTokenizer._tokenize: basic tokenizer, then WordPiece."""
        out = []
        for token in self.basic.tokenize(chunk, never_split=self.SPECIALS):
            if token in self.basic.never_split:
                out.append(token)
            else:
                out.extend(self.wordpiece.tokenize(token))
        return out

    def convert_tokens_to_ids(self, tokens):
        return [self.vocab.get(t, self.vocab["[UNK]"]) for t in tokens]

    def encode(self, text, text_pair=None, max_length=None):
        ids = self.convert_tokens_to_ids(self.tokenize(text))
        pair = self.convert_tokens_to_ids(self.tokenize(text_pair)) if text_pair is not None else None
        if max_length is not None:
            extra = 3 if pair is not None else 2
            remove = len(ids) + (len(pair) if pair is not None else 0) + extra - max_length
            if remove > 0:
                if pair is None:
                    ids = ids[:-remove]
                else:  # longest_first, as truncate_sequences does it
                    first = min(abs(len(pair) - len(ids)), remove)
                    second = remove - first
                    if len(ids) > len(pair):
                        ids_cut, pair_cut = first + second // 2, second - second // 2
                    else:
                        ids_cut, pair_cut = second // 2, first + second - second // 2
                    ids = ids[:-ids_cut] if ids_cut > 0 else ids
                    pair = pair[:-pair_cut] if pair_cut > 0 else pair
        cls, sep = self.vocab["[CLS]"], self.vocab["[SEP]"]
        if pair is None:
            return [cls] + ids + [sep], [0] * (len(ids) + 2)
        return [cls] + ids + [sep] + pair + [sep], [0] * (len(ids) + 2) + [1] * (len(pair) + 1)

    def decode(self, ids, skip_special_tokens=True):
        tokens = [self.ids_to_tokens.get(i, "[UNK]") for i in ids]
        sub_texts, current = [], []
        for i, token in zip(ids, tokens):
            if skip_special_tokens and i in self.special_ids:
                continue
            if token in self.SPECIALS:
                if current:
                    sub_texts.append(" ".join(current).replace(" ##", "").strip())
                    current = []
                sub_texts.append(token)
            else:
                current.append(token)
        if current:
            sub_texts.append(" ".join(current).replace(" ##", "").strip())
        text = " ".join(sub_texts)
        for a, b in [(" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                     (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                     (" 're", "'re")]:
            text = text.replace(a, b)
        return text


# --- the test lines -----------------------------------------------------------


def corpus_lines():
    """Real lines: sentences of the committed speech and novel excerpts."""
    lines = []
    for path in sorted(glob.glob(os.path.join(FIXTURES, "corpus", "*", "*.txt"))):
        with open(path, encoding="utf-8") as f:
            for paragraph in f.read().split("\n"):
                # Sentences of a few dozen words, so a failure points at a short line.
                for sentence in re.split(r"(?<=[.;?!])\s+", paragraph):
                    if sentence.strip():
                        lines.append(sentence)
    return lines


HANDMADE = [
    "Hello, World! How are you doing today?",
    "The [MASK] of the union is strong.",
    "the[MASK]of the union [SEP] second part [CLS][PAD][UNK]",
    "[mask] lower-case specials are ordinary text; [unused0] and [unused12] too",
    "[MA\x00SK] hidden special; [MASK\u200b] zero-width",
    "Café résumé naïve façade coöperate Zoë Ångström Øresund Łódź São Paulo",
    "ÀÉÎÕÜ àéîõü ÇÑ çñ Ǆ ǅ ǆ ﬁ ﬂ ß ẞ",
    "Crème brûlée, piñata, jalapeño, über, Straße, Mädchen, Ærøskøbing",
    "e\u0301 a\u0308 o\u0302 n\u0303 combining sequences e\u0301\u0327",
    "ΟΔΟΣ Σίσυφος ΣΙΣΥΦΟΣ ὈΔΥΣΣΕΎΣ λόγος Σ σ ς",
    "İstanbul ıi İİ KELVIN \u212a ANGSTROM \u212b OHM \u2126",
    "Москва́ — столица России. Ёлка ёж Щука",
    "中文分词测试：我爱北京天安门。",
    "日本語のテキスト、ひらがなとカタカナ。東京タワー",
    "한국어 텍스트 서울특별시 안녕하세요",
    "Mixed中文and English文字together",
    "Compatibility ideographs \uf900\uf901\ufa0e\ufa10 and ext-B \U00020000\U0002a6d6",
    "Emoji 😀😃 🎉 👍🏽 👨\u200d👩\u200d👧 ❤️ 🇺🇸 ✈︎",
    "Arabic العربية and Hebrew עברית, Thai ภาษาไทย, Hindi हिन्दी",
    "Control\x01chars\x07here\x1b[0m and\x7fdel\x0bvt\x0cff tab\there\rcr\nnl",
    "Line\u2028separator and\u2029paragraph separator, nbsp\u00a0here, thin\u2009space",
    "Ideographic\u3000space, en\u2002quad, ogham\u1680mark, narrow\u202fnbsp",
    "Zero\u200bwidth\u200cnon\u200djoiner\u2060word joiner\ufeffBOM\u00adsoft hyphen",
    "Replacement \ufffd char and private use \ue000\uf8ff and noncharacter \ufdd0",
    "Pneumonoultramicroscopicsilicovolcanoconiosis is a long word.",
    "a" * 100 + " exactly one hundred",
    "b" * 101 + " one hundred and one",
    "supercalifragilisticexpialidocious" * 3 + "x",
    ("antidisestablishmentarianism" * 4)[:100] + " " + "é" * 101,
    "Punctuation: !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ and ¡¿«»„“”‘’‹›—–… §¶†‡•",
    "Math ∑∫√∞≈≠≤≥ ± × ÷ and currency $ € £ ¥ ₹ ₿ ¢",
    "Numbers 3,000,000 florins, 1.5e-10, 42nd, ½ ¾ ² ³ Ⅻ ①②③",
    "Full-width ＡＢＣ ａｂｃ １２３ ！？ and half-width ｶﾀｶﾅ",
    "URLs: https://example.com/path?q=1&r=2#frag e-mail: someone@example.org",
    "",
    "   ",
    "\t\n\r",
    "don't won't I'm you're we've it's can't",
    "Mr. Smith's 1960s U.S.A. state-of-the-art co-operation re-elect",
    "GREEK final ΤΕΛΟΣ. ΤΕΛΟΣ.Α ΤΕΛΟΣ's ΑΣ",
    "Vietnamese: Tiếng Việt có dấu, Nguyễn, Đà Nẵng, thành phố Hồ Chí Minh",
    "Polish: Zażółć gęślą jaźń; Czech: Příliš žluťoučký kůň",
    "Turkish dotless ı and İ, Azeri ə, Icelandic þ ð",
    "Symbols ™ © ® ℃ ℉ № ℗ ℠ and arrows ← ↑ → ↓ ↔",
    "Box drawing ┌─┐│└┘ and blocks █▓▒░",
    "Musical 𝄞 and math alphanumerics 𝐀𝐁𝐂 𝔸𝔹ℂ 𝒜",
    "Tibetan བོད་སྐད་ and Devanagari with nukta क़ ख़",
]

# Characters mixed into real lines: accents, combining marks, CJK, emoji,
# controls, format characters, separators and punctuation of many scripts.
# Only characters assigned before Unicode 14 (Python 3.11's unicodedata) so
# both Unicode databases agree on them.
MIX = (
    "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿāăąćčďđēęěğīıķłńňőœřśşšťūůűųźżžșțḃẞ"
    "ÀÉÎÕÜÇÑØÅÆŒ\u0300\u0301\u0302\u0303\u0308\u0327\u0345\u20dd"
    "中文字国人大北京天安门日本語漢字测试\uf900\ufa0e\U00020000"
    "ひらがなカタカナ한국어ㄱㅏ"
    "😀🎉👍🏽❤️🇺🇸\u200d\ufe0f"
    "\x00\x01\x07\x1b\x7f\x85\u200b\u200c\u200e\u2060\ufeff\u00ad\ufffd\ue000"
    "\u00a0\u2002\u2009\u202f\u3000\u2028\u2029\t\r\n"
    "—–…‘’“”«»¡¿§¶†‡•·、。！？（）「」《》"
    "ΑΒΓΔΣσςαβγδ АБВГДабвгдЁё אבג ابت"
    "ℌℍ\u212a\u212b\u2126ﬁﬂ½²①Ⅻ𝐀ＡＢａｂ１"
)


def mixed_lines(base, count, rng):
    out = []
    for _ in range(count):
        chars = list(rng.choice(base))
        for _ in range(rng.randint(1, 8)):
            chars.insert(rng.randint(0, len(chars)), rng.choice(MIX))
        out.append("".join(chars))
    return out


def main():
    vocab_path = os.path.join(FIXTURES, "bert-base-uncased-vocab.txt")
    with open(vocab_path, "rb") as f:
        vocab_md5 = hashlib.md5(f.read()).hexdigest()
    uncased = BertTokenizer(vocab_path, do_lower_case=True)
    cased = BertTokenizer(vocab_path, do_lower_case=False)
    rng = random.Random(20240501)

    real = corpus_lines()
    short = [s for s in real if len(s) <= 400]
    lines = [(s, True) for s in real[:1800]]
    lines += [(s, True) for s in HANDMADE]
    lines += [(s, False) for s in HANDMADE]  # cased, no accent stripping
    lines += [(s, False) for s in rng.sample(short, 150)]
    lines += [(s, True) for s in mixed_lines(short, 400, rng)]
    lines += [(s, False) for s in mixed_lines(short, 100, rng)]

    out_path = os.path.join(FIXTURES, "tokenizer_golden.jsonl")
    records = []
    for text, lowercase in lines:
        tok = uncased if lowercase else cased
        ids, types = tok.encode(text)
        records.append({"text": text, "lowercase": lowercase, "ids": ids,
                        "decoded": tok.decode(ids)})
    # Pairs with longest-first truncation (token types 0/1).
    for _ in range(150):
        a, b = rng.choice(short), rng.choice(short)
        max_length = rng.choice([8, 16, 24, 32, 64, 512])
        ids, types = uncased.encode(a, b, max_length=max_length)
        records.append({"text": a, "text_pair": b, "max_length": max_length, "lowercase": True,
                        "ids": ids, "token_type_ids": types})
    for _ in range(50):
        a = rng.choice(short)
        max_length = rng.choice([4, 10, 20])
        ids, types = uncased.encode(a, max_length=max_length)
        records.append({"text": a, "max_length": max_length, "lowercase": True, "ids": ids})

    header = {
        "reference": REFERENCE,
        "script": "tests/golden/make_tokenizer_golden.py",
        "python": sys.version.split()[0],
        "unicodedata": unicodedata.unidata_version,
        "vocab": "tests/fixtures/bert-base-uncased-vocab.txt",
        "vocab_md5": vocab_md5,
        "records": len(records),
    }
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(json.dumps(header, ensure_ascii=False) + "\n")
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {len(records)} records to {out_path}")


if __name__ == "__main__":
    main()
