#!/usr/bin/python3
"""Writes the golden files of the Chinese (RoFormer) tokenizer:

  tests/fixtures/zh/jieba_golden.jsonl   ids for >= 2,000 lines, and jieba's words
  tests/fixtures/zh/jieba_dict.txt       the part of jieba's dict.txt these lines use
  tests/fixtures/zh/vocab_extra.txt      Chinese pieces appended to bert-base-uncased

Reference: Hugging Face's RoFormerTokenizer rule, ported here because
transformers is not available on this machine (no PyPI; Debian does not
package it): after PreTrainedTokenizer.tokenize cuts out the special tokens
and lower-cases the rest character by character, each chunk is segmented by
jieba *without HMM* (`jieba.cut(text, HMM=False)`); a segment that is itself a
vocab entry is one token, every other segment goes through BERT's
BasicTokenizer and WordPiece. jieba is Debian's python3-jieba (0.42.1) with
its own dict.txt; BERT's basic tokenizer and WordPiece are the independent
pure-Python port in make_tokenizer_golden.py (Python's unicodedata).

The dictionary excerpt keeps every dict.txt line whose word occurs in one of
the golden lines, in the original order, plus one line "〇〇〇〇 N x" whose
frequency N makes the total that of the full dictionary. jieba only ever
looks up substrings of the text it cuts, and 〇 (U+3007) is outside jieba's
han blocks, so the excerpt cuts these lines exactly as the full dictionary
does; the script checks that on every line.

Run with /usr/bin/python3 (python3-jieba installed):
    /usr/bin/python3 tests/golden/make_jieba_golden.py
Inputs: tests/fixtures/zh/corpus/*.txt (public-domain classical Chinese from
npm chinese-poetry), tests/fixtures/bert-base-uncased-vocab.txt.
"""
import collections
import glob
import hashlib
import json
import logging
import os
import random
import sys
import tempfile

import jieba

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tokenizer_golden as bert  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
ZH = os.path.join(FIXTURES, "zh")
DICT = os.path.join(os.path.dirname(jieba.__file__), "dict.txt")
BALANCE_WORD = "〇〇〇〇"
REFERENCE = ("RoFormerTokenizer rule (transformers) ported: python3-jieba cut(HMM=False) + "
             "vocab lookup, else the pure-Python BertTokenizer port")


class RoFormerTokenizer(bert.BertTokenizer):
    def __init__(self, vocab_file, jieba_tokenizer, do_lower_case=True):
        super().__init__(vocab_file, do_lower_case=do_lower_case)
        self.jieba = jieba_tokenizer

    def _tokenize(self, chunk):
        """RoFormerTokenizer._tokenize: jieba words in the vocab stay whole."""
        out = []
        for word in self.jieba.cut(chunk, HMM=False):
            if word in self.vocab:
                out.append(word)
            else:
                out.extend(super()._tokenize(word))
        return out


# --- the lines ---------------------------------------------------------------


def corpus_lines():
    lines = []
    for path in sorted(glob.glob(os.path.join(ZH, "corpus", "*.txt"))):
        with open(path, encoding="utf-8") as f:
            lines += [l for l in f.read().split("\n") if l.strip()]
    return lines


# Modern Chinese mixed with English, digits, punctuation and full-width forms
# (written for this test).
MODERN = [
    "我们在2024年3月15日发布了RoFormer的第2版，支持GPU和CPU训练。",
    "请访问https://example.com/docs?lang=zh-CN&page=2获取更多信息。",
    "Python 3.11和C++20都是常用的编程语言，Linux内核版本是6.1.0-18-amd64。",
    "今天的气温是-5.5℃，明天会升到12°C左右，湿度约为85%。",
    "他的电子邮件地址是zhang.san@example.org，电话是+86 10 1234 5678。",
    "ＡＢＣ全角字母和１２３全角数字，还有全角标点！？（）［］｛｝",
    "这台笔记本电脑售价￥6,999.00元，打八折后只要5599.2元。",
    "机器学习（Machine Learning）是人工智能的一个分支。",
    "深度学习模型BERT、GPT-4和RoFormer都基于Transformer架构。",
    "北京大学和清华大学都位于北京市海淀区。",
    "我爱北京天安门，天安门上太阳升。",
    "小明硕士毕业于中国科学院计算所，后在日本京都大学深造。",
    "工信处女干事每月经过下属科室都要亲口交代24口交换机等技术性器件的安装工作。",
    "结婚的和尚未结婚的都来参加了这次聚会。",
    "iPhone 15 Pro Max的屏幕是6.7英寸，重量约221克。",
    "第一章 总则 第1条 为了规范数据处理活动，保障数据安全，制定本法。",
    "他说：“明天见！”她回答：‘好的……’",
    "《红楼梦》、《西游记》、《水浒传》和《三国演义》是四大名著。",
    "C#、F#、.NET和Node.js都能用来写Web服务；AT&T是一家美国公司。",
    "长江是中国第一长河，全长约6300公里，流经11个省级行政区。",
    "会议定于下午2:30在3号楼305室召开，请准时参加。",
    "这个 API 返回 JSON 格式的数据：{\"code\": 200, \"msg\": \"ok\"}。",
    "用户名：admin_01，密码：P@ssw0rd!，请勿泄露。",
    "The quick brown fox jumps over the lazy dog. 敏捷的棕色狐狸跳过了懒狗。",
    "Hello世界！Ｈｅｌｌｏ　Ｗｏｒｌｄ！",
    "2023年GDP增长5.2%，CPI同比上涨0.2%。",
    "这是一个非常非常非常非常非常长的句子，用来测试分词器在长文本上的表现是否正确。",
    "研究生命的起源是一个古老而又年轻的课题。",
    "南京市长江大桥于1968年建成通车。",
    "乒乓球拍卖完了。",
    "下雨天留客天留我不留。",
    "他从马上下来，马上就走了。",
    "中华人民共和国成立于1949年10月1日。",
    "我们需要3~5个工作日处理您的订单#A-1024。",
    "数学公式：E=mc²，a²+b²=c²，π≈3.14159。",
    "日本語のテキストも少し混ぜてみます。東京タワー",
    "한국어 문장도 섞어 봅니다. 서울특별시",
    "Emoji表情😀🎉👍🏽也会出现在聊天记录里❤️。",
    "Ｔｈｉｓ　ｉｓ　ｆｕｌｌ－ｗｉｄｔｈ　ｔｅｘｔ　ｗｉｔｈ　ｓｐａｃｅｓ。",
    "价格从¥99涨到了$15，约合€13.8或£11.9。",
    "Café résumé naïve，这些法语单词带有重音符号。",
    "ΑΒΓ希腊字母和АБВ西里尔字母。",
    "项目地址：github.com/user/repo，star数超过10k。",
    "2019-nCoV、COVID-19、SARS-CoV-2是同一种病毒的不同名称。",
    "我的QQ号是12345678，微信号是wx_abc-123。",
    "在Debian 12上运行apt-get install python3-jieba即可安装结巴分词。",
    "今天是个好日子，心想的事儿都能成。",
    "人工智能、大数据、云计算和物联网是新一代信息技术。",
    "上海浦东新区陆家嘴金融贸易区",
    "中国人民银行宣布下调存款准备金率0.25个百分点。",
    "电脑的CPU占用率达到了100%，风扇转速3000rpm。",
    "I'm learning Chinese：我正在学习中文。Don't worry!",
    "繁體中文的句子也應該被正確地分詞。",
    "Ｃ＋＋和Ｊａｖａ哪个更好？",
    "第3.2.1节 实验结果（见表2-1和图3-4）",
    "标点符号：，。、；：？！“”‘’（）【】《》——……·",
    "ASCII punctuation: !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ 和中文混排",
    "[MASK]是中国的首都。",
    "床前明月[MASK]，疑是地上霜。",
    "举头望明月，低头思[MASK][MASK]。[SEP]第二句[CLS][PAD][UNK]",
    "[mask]小写的特殊标记不是特殊标记",
    "制表符\t分隔\t的\t文本 和 多个   空格",
    "Windows换行\r\n和Unix换行\n混在一起",
    "零宽\u200b空格和\u00a0不换行空格，以及\u3000全角空格",
    "控制字符\x01\x07\x1b也会被清除",
    "兼容汉字\uf900\uf901和扩展汉字\u9fd6\u9fea\u9fff以及\U00020000\U0002a6d6",
    "扩展A区汉字\u3400\u4db5和部首⺀⺁",
    "a" * 100 + "刚好一百个字母",
    "b" * 101 + "一百零一个字母",
    "1" * 150 + "很长的数字串",
    "中" * 120,
    "测试" * 60,
    "超长英文单词supercalifragilisticexpialidocious" * 4,
    "",
    "   ",
    "，。！？",
    "……——",
    "!!!???...",
]

MIX = (
    list("，。、；：？！“”‘’（）【】《》—…·,.;:?!\"'()[]{}<>-_+#&%@/\\|~`^*=$")
    + ["the", "of", "RoFormer", "BERT", "GPU", "Python3", "iPhone", "Debian", "jieba",
       "2024", "3.14", "100%", "-5", "1,000", "v1.2.3", "C++", "a.b_c-d", "x86_64", "#1"]
    + list("ＡＢＣａｂｃ０１２３４５６７８９！？（）＋－")
    + [" ", "  ", "\t", "\u3000", "\u00a0", "\r\n", "\n", "\u200b"]
    + list("àéîõüçñÅÆŒßİı") + ["e\u0301", "a\u0308"]
    + list("ひらがなカタカナ한국어") + ["😀", "👍🏽", "❤️", "🇨🇳"]
    + ["[MASK]", "[SEP]", "[UNK]", "[mask]"]
    + list("學國車馬門見長東說話\uf900\u9fd6\u3400\U00020000")
)


def mixed_lines(base, count, rng):
    out = []
    for _ in range(count):
        chars = list(rng.choice(base))
        for _ in range(rng.randint(1, 6)):
            chars.insert(rng.randint(0, len(chars)), rng.choice(MIX))
        out.append("".join(chars))
    return out


# --- the dictionary excerpt and the vocab ------------------------------------


def dict_excerpt(lines, full):
    """Lines of dict.txt whose word is a substring of some line."""
    words = set()
    max_len = max(len(w) for w in full.FREQ)
    for text in lines:
        for variant in (text, text.lower()):
            n = len(variant)
            for i in range(n):
                for j in range(i + 1, min(n, i + max_len) + 1):
                    w = variant[i:j]
                    if w not in full.FREQ:
                        break
                    if full.FREQ[w]:
                        words.add(w)
    kept, total, kept_total = [], 0, 0
    with open(DICT, "rb") as f:
        for raw in f:
            line = raw.strip().decode("utf-8")
            word, freq = line.split(" ")[:2]
            total += int(freq)
            if word in words:
                kept.append(line)
                kept_total += int(freq)
    assert BALANCE_WORD not in full.FREQ
    kept.append(f"{BALANCE_WORD} {total - kept_total} x")
    return kept


def build_extra_vocab(lines, cutter, base_vocab):
    """Characters and frequent jieba words of the lines missing from the base vocab."""
    chars, words = collections.Counter(), collections.Counter()
    basic = bert.BasicTokenizer(do_lower_case=True)
    for text in lines:
        for w in cutter.cut(text.lower(), HMM=False):
            if len(w) > 1 and not w.isspace():
                words[w] += 1
            for token in basic.tokenize(w):
                chars.update(token)
    extra = []
    for c, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0])):
        if c not in base_vocab and c not in extra:
            extra.append(c)
    # Half of the words seen twice or more: the other half, and the words seen
    # once, take the BERT path.
    frequent = [w for w, n in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])) if n >= 2]
    for w in frequent[::2]:
        if w not in base_vocab and w not in extra:
            extra.append(w)
    return extra


def main():
    jieba.setLogLevel(logging.ERROR)
    rng = random.Random(20241115)
    real = corpus_lines()
    short = [l for l in real if len(l) <= 200]
    long_lines = ["".join(rng.sample(short, 40)) for _ in range(8)]
    long_lines.append("".join(rng.sample(short, 150)))  # ~4,000 characters
    mixed = mixed_lines(short, 700, rng)

    cases = [(l, True) for l in real]
    cases += [(l, True) for l in MODERN] + [(l, False) for l in MODERN]
    cases += [(l, True) for l in mixed[:550]] + [(l, False) for l in mixed[550:]]
    cases += [(l, True) for l in long_lines]
    cases += [(l, False) for l in rng.sample(real, 100)]

    full = jieba.Tokenizer(dictionary=DICT)
    full.initialize()
    excerpt_lines = dict_excerpt([t for t, _ in cases], full)
    dict_path = os.path.join(ZH, "jieba_dict.txt")
    with open(dict_path, "w", encoding="utf-8") as f:
        f.write("\n".join(excerpt_lines) + "\n")
    small = jieba.Tokenizer(dictionary=dict_path)
    small.tmp_dir = tempfile.mkdtemp()
    small.initialize()
    for text, _ in cases:
        for variant in (text, text.lower()):
            a = list(full.cut(variant, HMM=False))
            b = list(small.cut(variant, HMM=False))
            assert a == b, (variant, a, b)

    base_path = os.path.join(FIXTURES, "bert-base-uncased-vocab.txt")
    base = bert.load_vocab(base_path)
    extra = build_extra_vocab(real + MODERN, full, base)
    extra_path = os.path.join(ZH, "vocab_extra.txt")
    with open(extra_path, "w", encoding="utf-8") as f:
        f.write("\n".join(extra) + "\n")
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as f:
        with open(base_path, encoding="utf-8") as b:
            f.write(b.read())
        f.write("\n".join(extra) + "\n")
        vocab_path = f.name
    uncased = RoFormerTokenizer(vocab_path, full, do_lower_case=True)
    cased = RoFormerTokenizer(vocab_path, full, do_lower_case=False)
    os.unlink(vocab_path)

    records = []
    for i, (text, lowercase) in enumerate(cases):
        tok = uncased if lowercase else cased
        ids, _ = tok.encode(text)
        r = {"text": text, "lowercase": lowercase, "ids": ids}
        if i < 600:  # jieba's own words for the segmenter test
            r["words"] = list(full.cut(text, HMM=False))
        records.append(r)

    def md5(path):
        with open(path, "rb") as f:
            return hashlib.md5(f.read()).hexdigest()

    header = {
        "reference": REFERENCE,
        "script": "tests/golden/make_jieba_golden.py",
        "python": sys.version.split()[0],
        "jieba": jieba.__version__,
        "dict_md5": md5(DICT),
        "dict_excerpt": "tests/fixtures/zh/jieba_dict.txt",
        "vocab": "tests/fixtures/bert-base-uncased-vocab.txt + tests/fixtures/zh/vocab_extra.txt",
        "vocab_size": len(base) + len(extra),
        "records": len(records),
    }
    out_path = os.path.join(ZH, "jieba_golden.jsonl")
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(json.dumps(header, ensure_ascii=False) + "\n")
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {len(records)} records to {out_path}, {len(excerpt_lines)} dict lines, "
          f"{len(extra)} extra vocab pieces")


if __name__ == "__main__":
    main()
