#!/usr/bin/env python3
"""Trains small byte-level BPE tokenizers with the Hugging Face `tokenizers` package and records
how it encodes and decodes a corpus of edge cases; m3serve's tokenizer tests compare against them.

Runs where `tokenizers` is installed (the GPU machine), then DIR/* goes to
tests/text_tokenizer/fixtures/:
    python3 tools/make_tokenizer_golden.py --out DIR [--bench-out DIR]

For each tokenizer in SHAPES (trained) and VARIANTS (components of `tiny` swapped) it writes
DIR/<name>/tokenizer.json (+ tokenizer_config.json for the bundled model's tokenizer) and
DIR/<name>/golden.json:
    {"tokenizers_version", "vocab_size", "cases": [{"name", "text" | "hex", "ids", "ids_with_special",
      "tokens" (id_to_token of each id; trained shapes only), "decoded", "decoded_skip_special"}],
     "decode_cases": [{"ids", "decoded", "decoded_skip_special"}]}
"hex" cases are raw bytes that are not valid UTF-8: the reference encodes
bytes.decode("utf-8", "replace") of them. "decoded*" decode "ids_with_special".

Pipelines are written as tokenizer.json components (the format m3serve reads) and loaded with
Tokenizer.from_str, so the files test exactly what is described here. `minimax_bundled` is the
tokenizer of the project's bundled small model: vocab 8192 with every MiniMax-M3 special token.
With --bench-out it also writes a ~1 MB text, the reference ids for it, and the reference encode
speed (bench.json), for the m3serve encode benchmark.
"""
import argparse
import json
import random
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The MiniMax markers of docs/reference.md 5.1, in the order of their real ids.
# The DSpark noise token's text is not public; `]<]noise[>[` is m3serve's name for it.
MINIMAX_SPECIALS = [
    "]!p~[", "]~b]", "[e~[", "]!d~[", "]<]image[>[", "]<]video[>[", "]<]start of image[>[",
    "]<]end of image[>[", "]<]vision pad[>[", "]~!b[", "<think>", "</think>", "<minimax:tool_call>",
    "</minimax:tool_call>", "]<]noise[>[", "<mm:think>", "</mm:think>", "]<]minimax[>[",
]
# The markers the small golden tokenizers carry (issue 3).
GOLDEN_SPECIALS = ["]~!b[", "]~b]", "[e~[", "<mm:think>", "</mm:think>", "]<]minimax[>["]

GPT4_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def added(content, special=False, **flags):
    token = {"content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": not special, "special": special}
    token.update(flags)
    return token


# Non-special added tokens with every matching flag.
ADDED_TOKENS = [
    added("[[TOOL]]", lstrip=True, rstrip=True, normalized=False),
    added("hello_world", single_word=True),
    added("MyAddedToken"),
    added("<|fim|>", normalized=False),
    added("<unused_special>", special=True, rstrip=True),
]


def byte_level_pre(add_prefix_space, use_regex):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True,
            "use_regex": use_regex}


def split(pattern, behavior, regex=True, invert=False):
    return {"type": "Split", "pattern": {"Regex" if regex else "String": pattern},
            "behavior": behavior, "invert": invert}


BYTE_LEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                      "use_regex": True}
BYTE_LEVEL_POST = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                   "use_regex": True}


def template(single):
    return {"type": "TemplateProcessing", "single": single}  # ids filled in after training


SHAPES = [
    {   # GPT-2: ByteLevel with its own regex, no prefix space.
        "name": "gpt2", "vocab_size": 2048,
        "normalizer": None,
        "pre_tokenizer": byte_level_pre(False, True),
        "post_processor": BYTE_LEVEL_POST,
        "decoder": BYTE_LEVEL_DECODER,
        "specials": GOLDEN_SPECIALS, "added": ADDED_TOKENS,
    },
    {   # GPT-2 with a prefix space, NFKC + lowercase, and a BOS/EOS template.
        "name": "gpt2_prefix_nfkc_lower", "vocab_size": 1536,
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
        "pre_tokenizer": byte_level_pre(True, True),
        "post_processor": template(["]~!b[", "$A", "[e~["]),
        "decoder": BYTE_LEVEL_DECODER,
        "specials": GOLDEN_SPECIALS, "added": ADDED_TOKENS,
    },
    {   # GPT-4 / cl100k (and Llama-3): Split regex + ByteLevel without regex, ignore_merges.
        "name": "cl100k_style", "vocab_size": 2048, "ignore_merges": True,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split(GPT4_PATTERN, "Isolated"), byte_level_pre(False, False)]},
        "post_processor": BYTE_LEVEL_POST,
        "decoder": BYTE_LEVEL_DECODER,
        "specials": GOLDEN_SPECIALS, "added": ADDED_TOKENS,
    },
    {   # Qwen2: NFC, single-digit numbers (Digits + regex), BOS template.
        "name": "qwen2_style", "vocab_size": 2048,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            split(QWEN2_PATTERN, "Isolated"), byte_level_pre(False, False)]},
        "post_processor": template(["]~!b[", "$A"]),
        "decoder": BYTE_LEVEL_DECODER,
        "specials": GOLDEN_SPECIALS, "added": ADDED_TOKENS,
    },
    {   # Every Split behaviour, invert, Strip/Replace normalizers, a prefix space per piece.
        "name": "split_behaviors", "vocab_size": 1024,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Strip", "strip_left": True, "strip_right": True},
            {"type": "Replace", "pattern": {"Regex": r"\s{3,}"}, "content": "\u2003"},
            {"type": "NFD"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split(r"\d+", "Removed"),
            split("-", "MergedWithPrevious", regex=False),
            split(r"[,;:]", "MergedWithNext"),
            split(r"\p{Lu}+", "Contiguous"),
            split(r"\s+", "MergedWithPrevious", invert=True),
            {"type": "Digits", "individual_digits": False},
            byte_level_pre(True, False)]},
        "post_processor": {"type": "Sequence", "processors": [
            BYTE_LEVEL_POST, template(["[e~[", "$A", "]~b]"])]},
        "decoder": {"type": "Sequence", "decoders": [BYTE_LEVEL_DECODER]},
        "specials": GOLDEN_SPECIALS, "added": ADDED_TOKENS,
    },
    {   # Llama-2 style: "▁" words, byte fallback for unknown characters, unk fusing.
        "name": "llama_byte_fallback", "vocab_size": 1200, "byte_fallback": True,
        "unk_token": "<unk>", "fuse_unk": True, "limit_alphabet": 160,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": split("\u2581", "MergedWithNext", regex=False),
        "post_processor": template(["<s>", "$A"]),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "specials": ["<unk>", "<s>", "</s>"] + GOLDEN_SPECIALS, "added": ADDED_TOKENS,
    },
    {   # A tiny byte-level vocabulary: the base of the VARIANTS below.
        "name": "tiny", "vocab_size": 384,
        "normalizer": None,
        "pre_tokenizer": byte_level_pre(False, True),
        "post_processor": BYTE_LEVEL_POST,
        "decoder": BYTE_LEVEL_DECODER,
        "specials": ["<unk>"] + GOLDEN_SPECIALS, "added": ADDED_TOKENS,
    },
    {   # The bundled model's tokenizer: GPT-4/Qwen style, 8192 ids, MiniMax specials last.
        "name": "minimax_bundled", "vocab_size": 8192, "bundled": True,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split(GPT4_PATTERN, "Isolated"), byte_level_pre(False, False)]},
        "post_processor": BYTE_LEVEL_POST,
        "decoder": BYTE_LEVEL_DECODER,
        "specials": [], "added": [added(t, special=True) for t in MINIMAX_SPECIALS],
    },
]


def _pipeline(normalizer=None, pre_tokenizer=None, decoder=None, post_processor=None, **model):
    """A function that swaps components of a finished tokenizer.json (None keeps the base's)."""
    def derive(spec):
        for key, value in (("normalizer", normalizer), ("pre_tokenizer", pre_tokenizer),
                           ("decoder", decoder), ("post_processor", post_processor)):
            if value is not None:
                spec[key] = None if value == "null" else value
        spec["model"].update(model)
        return spec
    return derive


def _with_added(tokens, **components):
    def derive(spec):
        spec = _pipeline(**components)(spec)
        next_id = max([t["id"] for t in spec["added_tokens"]] + [len(spec["model"]["vocab"]) - 1]) + 1
        for token in tokens:
            entry = dict(token)
            entry["id"] = spec["model"]["vocab"].get(token["content"], next_id)
            next_id += token["content"] not in spec["model"]["vocab"]
            spec["added_tokens"].append(entry)
        return spec
    return derive


def _affix_model(spec):
    """A hand-made vocabulary with a continuing-subword prefix and an end-of-word suffix."""
    vocab = {}
    def add(token):
        vocab.setdefault(token, len(vocab))
    add("<unk>")
    for c in "abcdefgh":
        for token in (c, "##" + c, c + "</w>", "##" + c + "</w>"):
            add(token)
    merges = []
    for left, right in (("a", "##b"), ("ab", "##c"), ("##d", "##e</w>"), ("a", "##b</w>"),
                        ("##c", "##d"), ("ab", "##cd"), ("##a", "##b")):
        merges.append([left, right])
        add(left + right[2:])
    spec["model"].update({"vocab": vocab, "merges": merges, "unk_token": "<unk>",
                          "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>",
                          "fuse_unk": False, "byte_fallback": False, "ignore_merges": False})
    spec["added_tokens"] = [dict(added("<unk>", special=True), id=0)]
    spec["normalizer"] = None
    spec["pre_tokenizer"] = split(r"\s+", "Removed")
    spec["post_processor"] = None
    spec["decoder"] = None
    return spec


# Variants of `tiny`: components swapped after training (the merges stay valid for any pipeline).
VARIANTS = [
    ("regex_classes", _pipeline(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        split(r"^ *\w|\w$|\h+|$", "Isolated"), byte_level_pre(False, False)]})),
    ("literal_patterns", _pipeline(
        normalizer={"type": "Replace", "pattern": {"String": "(a)"}, "content": "[$1]"},
        pre_tokenizer={"type": "Sequence", "pretokenizers": [
            split(".|", "MergedWithNext", regex=False), split("", "Removed", regex=False),
            byte_level_pre(True, False)]})),
    ("replace_normalizers", _pipeline(normalizer={"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"Regex": r"^\s+|\s+$"}, "content": ""},
        {"type": "Replace", "pattern": {"Regex": r"^a|b$|^$"}, "content": "-"},
        {"type": "Lowercase"}, {"type": "NFKD"}]})),
    ("roberta_post", _pipeline(post_processor={
        "type": "RobertaProcessing", "sep": ["[e~[", 3], "cls": ["]~!b[", 1],
        "trim_offsets": True, "add_prefix_space": False})),
    ("no_decoder", _pipeline(decoder="null", pre_tokenizer=byte_level_pre(True, True))),
    ("strip_replace_decoder", _pipeline(decoder={"type": "Sequence", "decoders": [
        {"type": "Strip", "content": "\u0120", "start": 1, "stop": 0},
        {"type": "Replace", "pattern": {"String": "\u010a"}, "content": "<NL>"},
        BYTE_LEVEL_DECODER]})),
    ("unk_fused", _pipeline(pre_tokenizer=split(r"\s+", "Removed"), decoder={"type": "Fuse"},
                            unk_token="<unk>", fuse_unk=True)),
    ("unk_not_fused", _pipeline(pre_tokenizer=split(r"\s+", "Removed"), decoder="null",
                                unk_token="<unk>", fuse_unk=False)),
    ("unknown_dropped", _pipeline(pre_tokenizer=split(r"\s+", "Isolated"), decoder="null")),
    ("added_edge_cases", _with_added([
        added("SpecialUP", special=True, normalized=True, lstrip=True),
        added("<|fim|>", special=True, single_word=True),
        added("\u0120the", normalized=False),
        added(" spaced tok ", single_word=True, lstrip=True, rstrip=True, normalized=False),
    ], normalizer={"type": "Lowercase"}, pre_tokenizer=byte_level_pre(True, True))),
    ("affixes", _affix_model),
]

TRAIN_TEXTS = [
    # English prose
    "The quick brown fox jumps over the lazy dog. It's a sunny day, isn't it? We'll see.",
    "Tokenizers split text into pieces; a model reads the pieces as numbers. Numbers like 42, "
    "3.14159, 1,000,000 and 2024-06-01 appear everywhere in documents, logs and code.",
    "She said: \"Don't worry, I'M fine.\" They've been here since 1999 and they'll stay.",
    "In the beginning the Universe was created. This has made a lot of people very angry and "
    "been widely regarded as a bad move.",
    # Code
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n\n\nprint([fibonacci(i) for i in range(10)])\n",
    "#include <vector>\n#include <string>\n\ntemplate <typename T>\nstd::vector<T> reversed(const "
    "std::vector<T>& v) {\n  return {v.rbegin(), v.rend()};\n}\n\nint main() { return 0; }\n",
    "fn main() {\n    let xs: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", "
    "xs);\n}\n",
    "const add = (a, b) => a + b;\nexport default function App() {\n  return <div className=\"app\">"
    "{add(1, 2)}</div>;\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;\n",
    "for f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}' >> counts.log\ndone\n",
    "{\"model\": \"minimax-m3\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
    "\"temperature\": 0.7, \"max_tokens\": 1024}",
    "func (s *Server) Handle(w http.ResponseWriter, r *http.Request) {\n\tif err := s.do(r); err "
    "!= nil {\n\t\thttp.Error(w, err.Error(), 500)\n\t}\n}\n",
    # Chinese, Japanese, Korean
    "人工智能是计算机科学的一个分支，它企图了解智能的实质，并生产出一种新的能以人类智能相似的方式做出反应的智能机器。"
    "该领域的研究包括机器人、语言识别、图像识别、自然语言处理和专家系统等。",
    "今天天气很好，我们去公园散步吧。你好，世界！这是一个测试。北京是中国的首都，上海是最大的城市。",
    "日本語のテキストには、ひらがな、カタカナ、そして漢字が含まれます。東京は日本の首都です。"
    "私は毎朝コーヒーを飲みます。",
    "안녕하세요, 세계! 한국어 문장은 띄어쓰기를 사용합니다. 서울은 대한민국의 수도입니다.",
    # Other scripts
    "Привет, мир! Это проверка токенизатора. Москва — столица России.",
    "Καλημέρα κόσμε. Η γλώσσα είναι ελληνική. ΣΟΦΙΑ σοφία.",
    "مرحبا بالعالم. هذه جملة عربية مع أرقام ١٢٣ و٤٥٦.",
    "שלום עולם. זה משפט בעברית.",
    "नमस्ते दुनिया। यह हिंदी में एक वाक्य है।",
    "Ça va très bien, merci! Où est la bibliothèque? Größe, Straße, naïve café, İstanbul.",
    # Emoji and symbols
    "I love it 👍🏽😀🎉 ❤️ 👨‍👩‍👧‍👦 🇫🇷🇯🇵 1️⃣ ✨🚀 ∑∫√∞ ≤ ≥ ≠ → ← ½ ² ³ ① ② ™ © ®",
    # Whitespace
    "    indented line\n\tTabbed line\n\n\nblank lines above\r\nwindows line end   \n",
]


SOURCE_SUFFIXES = (".cc", ".h", ".cu", ".py", ".md", ".sh", ".cmake", ".jinja")


def repository_sources():
    """The repository's own sources and docs, in a stable order (no fixtures, builds or data)."""
    skipped = ("fixtures", "data", ".git", "node_modules", "__pycache__")
    for path in sorted(REPO.glob("**/*")):
        parts = path.relative_to(REPO).parts
        if (path.suffix in SOURCE_SUFFIXES and path.is_file() and path.stat().st_size < 1_000_000
                and not any(p in skipped or p.startswith(("build", ".")) for p in parts)):
            yield path


def training_corpus(bundled):
    """The embedded texts, repeated; the bundled tokenizer adds the repository's sources and docs
    and the Python standard library (about 8 MB), so its 7,918 merges are all learned."""
    corpus = TRAIN_TEXTS * 20
    if not bundled:
        return corpus
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = list(repository_sources()) + sorted(stdlib.glob("*.py")) + \
        sorted(stdlib.glob("*/*.py"))
    total = 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        corpus.append(text)
        total += len(text)
        if total > 8_000_000:
            break
    return corpus


def test_cases():
    cases = [
        ("empty", ""), ("space", " "), ("newline", "\n"), ("hello", "Hello world"),
        ("leading_spaces", "   leading spaces"), ("trailing_spaces", "trailing spaces   "),
        ("inner_spaces", "multiple    spaces   inside"),
        ("long_spaces", " " * 100 + "x" + " " * 37),
        ("long_newlines", "a" + "\n" * 50 + "b\n\n \n\t\n  \n"),
        ("mixed_ws", " \t \n\r\n \u00a0 \u3000 \u2028 \u180e \u200b \u0085 \u2003x"),
        ("contractions", "'s 't 're 've 'm 'll 'd 'S 'RE don't I'M they'LL"),
        ("python", TRAIN_TEXTS[4]), ("cpp", TRAIN_TEXTS[5]), ("rust", TRAIN_TEXTS[6]),
        ("json", TRAIN_TEXTS[10]), ("shell", TRAIN_TEXTS[9]),
        ("code_unseen", "async def handler(req):\n\tawait req.json()  # TODO: 100% coverage!!!\n"
                        "    x = {'k': [1, 2.5e-3, None]}\n"),
        ("chinese", "你好，世界！这是一个测试。机器学习和深度学习。"),
        ("japanese", "日本語のテキストとカタカナ、ひらがな。"),
        ("korean", "안녕하세요 세계, 반갑습니다."),
        ("rare_cjk", "龘靐齉爩 𠀀𠀁 𪚥"),
        ("emoji", "👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ 1️⃣ 🫠🦀"),
        ("combining", "e\u0301 \u00e9 A\u030a \u00c5 Z\u0351\u0307\u0327a\u0300\u0301lgo "
                      "\u1100\u1161\u11a8 \uac01"),
        ("compat", "\ufb01 \u2460\u2461 \uff21\uff22\uff23\uff11\uff12\uff13 \u216b \u00bd x\u00b2"),
        ("case", "İstanbul ΣΑΣ Straße ǅ MyAddedToken MYADDEDTOKEN myaddedtoken"),
        ("numbers", "1234567890 12345678901234567890 3.14159 1,000,000 0x1F 2024-01-01 -42"),
        ("numbers_unicode", "١٢٣ ۴۵۶ ½ Ⅷ ² ௧௨ ๑๒"),
        ("byte_level_chars", "ĠĊ Ġhello ÿþ ¡¬®"),
        ("replacement_char", "bad \ufffd byte \ufffd\ufffd"),
        ("controls", "\x00nul\x01\x02\x7f\x1b[31mred\x1b[0m"),
        ("noncharacters", "\uffff \ufffe \ue000 \U0010ffff \U0001f9ff"),
        ("specials_chat", "]~!b[]~b]system\nYou are helpful.[e~[\n]~b]user\nhi there[e~[\n]~b]ai\n"),
        ("specials_think", "<mm:think>Let me think... 2+2=4</mm:think>The answer is 4."),
        ("specials_tool", "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"f\">"
                          "]<]minimax[>[<arg>v]<]minimax[>[</arg>"),
        ("specials_adjacent", "a]~b]b]~b]]~b][e~[[e~[x"),
        ("specials_partial", "]~b ]~!b <mm:think <mm:<mm:think>think> ]<]minimax[>"),
        ("specials_spaces", "  ]~b]  user  [e~[  "),
        ("added_strip", "x [[TOOL]]  y\n[[TOOL]]\t[[TOOL]]z"),
        ("added_single_word", "a hello_world b ahello_world hello_worldx hello_world. _hello_world"),
        ("added_normalized", "say MyAddedToken now myaddedtoken"),
        ("added_raw", "<|fim|>code<|fim|> <|fim|"),
        ("added_special_rstrip", "<unused_special>   after <unused_special>"),
        ("long_word", "a" * 300),
        ("long_repeat", "supercalifragilisticexpialidocious" * 5),
        ("long_digits", "9" * 120),
        ("mixed_doc", "# Report\n\nRevenue grew 12.5% to $3,400,000 (¥25亿).\n\n"
                      "```python\nprint('héllo', \"世界\")  # 👋\n```\n\n"
                      "- [ ] todo\n- [x] done\t→ next\n"),
    ]
    out = [{"name": n, "text": t} for n, t in cases]
    hex_cases = [
        ("invalid_ff_fe", b"\xff\xfe abc"),
        ("truncated_cjk", b"abc\xe4\xb8"),
        ("truncated_mid", b"x\xe4\xb8y\xf0\x9f\x98z"),
        ("overlong", b"\xc0\xaf\xe0\x80\xaf"),
        ("surrogate_bytes", b"\xed\xa0\x80\xed\xbf\xbf"),
        ("above_max", b"\xf4\x90\x80\x80 \xf5\x80"),
        ("stray_continuation", b"\x80\x81 hi \xbf"),
        ("mixed_invalid", b"\xe2\x28\xa1 ok \xc3\x28 \xe2\x82\x28 done"),
    ]
    out += [{"name": n, "hex": b.hex()} for n, b in hex_cases]
    return out


def random_decode_cases(tokenizer, rng, count):
    """Random id sequences: they split multi-byte characters anywhere and mix in special ids."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    cases = []
    for _ in range(count):
        length = rng.randint(1, 40)
        cases.append([rng.randrange(size) for _ in range(length)])
    cases.append([tokenizer.token_to_id(c) for c in ("]~b]", "[e~[") if tokenizer.token_to_id(c)
                  is not None] + [size + 5])
    return cases


def build_skeleton(shape):
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": shape["normalizer"], "pre_tokenizer": shape["pre_tokenizer"],
        "post_processor": None, "decoder": shape["decoder"],
        "model": {"type": "BPE", "dropout": None, "unk_token": shape.get("unk_token"),
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": shape.get("fuse_unk", False),
                  "byte_fallback": shape.get("byte_fallback", False),
                  "ignore_merges": shape.get("ignore_merges", False), "vocab": {}, "merges": []},
    }


def train(shape):
    from tokenizers import Tokenizer, pre_tokenizers, trainers
    tok = Tokenizer.from_str(json.dumps(build_skeleton(shape)))
    options = {"vocab_size": base_vocab_size(shape), "min_frequency": 2, "show_progress": False,
               "special_tokens": shape["specials"]}
    if "ByteLevel" in json.dumps(shape["pre_tokenizer"]):
        options["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    if "limit_alphabet" in shape:
        options["limit_alphabet"] = shape["limit_alphabet"]
    tok.train_from_iterator(training_corpus(shape.get("bundled", False)),
                            trainer=trainers.BpeTrainer(**options))
    return Tokenizer.from_str(json.dumps(finalize(shape, json.loads(tok.to_str()))))


def base_vocab_size(shape):
    """The bundled tokenizer's specials come after the trained vocab, inside its 8192 ids."""
    return shape["vocab_size"] - (len(shape["added"]) if shape.get("bundled") else 0)


def finalize(shape, spec):
    """Adds byte-fallback tokens, the added tokens and the post-processor to a trained spec."""
    skeleton = build_skeleton(shape)["model"]
    spec["model"].update({k: v for k, v in skeleton.items() if k not in ("vocab", "merges")})
    vocab = spec["model"]["vocab"]
    if shape.get("bundled") and len(vocab) != base_vocab_size(shape):
        sys.exit(f"{shape['name']}: trained {len(vocab)} tokens, need {base_vocab_size(shape)}")
    if shape.get("byte_fallback"):
        for b in range(256):
            vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    # Added tokens get the ids the Rust loader assigns: the next ids after the vocab.
    next_id = len(vocab)
    for token in shape["added"]:
        entry = dict(token)
        entry["id"] = vocab.get(token["content"], next_id)
        if token["content"] not in vocab:
            next_id += 1
        spec["added_tokens"].append(entry)
    ids = dict(vocab)
    ids.update({t["content"]: t["id"] for t in spec["added_tokens"]})
    spec["post_processor"] = resolve_post_processor(shape["post_processor"], ids)
    return spec


def resolve_post_processor(post, ids):
    if post is None or post["type"] != "TemplateProcessing":
        if post is not None and post["type"] == "Sequence":
            return {"type": "Sequence",
                    "processors": [resolve_post_processor(p, ids) for p in post["processors"]]}
        return post
    single, specials = [], {}
    for piece in post["single"]:
        if piece == "$A":
            single.append({"Sequence": {"id": "A", "type_id": 0}})
        else:
            single.append({"SpecialToken": {"id": piece, "type_id": 0}})
            specials[piece] = {"id": piece, "ids": [ids[piece]], "tokens": [piece]}
    return {"type": "TemplateProcessing", "single": single,
            "pair": single + [{"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": specials}


def golden(tok, rng, with_tokens):
    cases = []
    for case in test_cases():
        text = bytes.fromhex(case["hex"]).decode("utf-8", "replace") if "hex" in case else case["text"]
        plain = tok.encode(text, add_special_tokens=False)
        full = tok.encode(text, add_special_tokens=True)
        entry = dict(case)
        if with_tokens:
            entry["tokens"] = [tok.id_to_token(i) for i in plain.ids]
        entry.update({
            "ids": plain.ids, "ids_with_special": full.ids,
            "decoded": tok.decode(full.ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(full.ids, skip_special_tokens=True),
        })
        cases.append(entry)
    decode_cases = [{"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                     "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)}
                    for ids in random_decode_cases(tok, rng, 24)]
    return {"cases": cases, "decode_cases": decode_cases}


def tokenizer_config():
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "]~!b[", "eos_token": "[e~[", "pad_token": "]!p~[", "unk_token": None,
        "add_bos_token": False, "add_eos_token": False,
        "model_max_length": 1048576, "clean_up_tokenization_spaces": False,
    }


def check_with_transformers(directory, tok):
    """Loads the bundled tokenizer as transformers does and reports any disagreement."""
    try:
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(str(directory))
        for case in test_cases():
            if "text" in case and hf.encode(case["text"], add_special_tokens=False) != \
                    tok.encode(case["text"], add_special_tokens=False).ids:
                print(f"transformers disagrees on {case['name']}")
        print(f"transformers {type(hf).__name__}: bos={hf.bos_token_id} eos={hf.eos_token_id} "
              f"pad={hf.pad_token_id} len={len(hf)}")
    except Exception as e:  # report, never fail the fixture run on it
        print(f"transformers check skipped: {type(e).__name__}: {e}")


def write_bench(out, tok):
    """A 1 MB text (repository sources and docs, then the training texts), the reference ids
    and the reference single-call encode time."""
    parts, total = [], 0
    for path in repository_sources():
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text.encode())
        if total > 1_100_000:
            break
    parts += TRAIN_TEXTS * 50
    data = "".join(parts).encode()[:1_000_000].decode("utf-8", "ignore")
    (out / "bench_text.txt").write_text(data, encoding="utf-8")
    best = None
    for _ in range(3):
        start = time.perf_counter()
        ids = tok.encode(data, add_special_tokens=False).ids
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    (out / "bench_ids.json").write_text(json.dumps(ids))
    info = {"bytes": len(data.encode()), "tokens": len(ids), "seconds": best,
            "mb_per_s": len(data.encode()) / best / 1e6, "tokens_per_s": len(ids) / best}
    (out / "bench.json").write_text(json.dumps(info, indent=1))
    print("reference encode:", info)


def write_fixture(directory, tok, rng, config=None, with_tokens=True):
    import tokenizers
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(tok.to_str(pretty=False), encoding="utf-8")
    if config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n",
                                                         encoding="utf-8")
    data = golden(tok, rng, with_tokens)
    data["tokenizers_version"] = tokenizers.__version__
    data["vocab_size"] = tok.get_vocab_size(with_added_tokens=True)
    (directory / "golden.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--bench-out", type=Path)
    args = parser.parse_args()
    from tokenizers import Tokenizer
    rng = random.Random(20240601)
    built = {}
    for shape in SHAPES:
        start = time.perf_counter()
        tok = train(shape)
        built[shape["name"]] = tok
        bundled = shape.get("bundled", False)
        write_fixture(args.out / shape["name"], tok, rng, tokenizer_config() if bundled else None)
        print(f"{shape['name']}: {tok.get_vocab_size(with_added_tokens=True)} tokens, "
              f"{time.perf_counter() - start:.1f}s", flush=True)
        if bundled:
            check_with_transformers(args.out / shape["name"], tok)
            if args.bench_out:
                args.bench_out.mkdir(parents=True, exist_ok=True)
                write_bench(args.bench_out, tok)
    for name, derive in VARIANTS:
        spec = derive(json.loads(built["tiny"].to_str()))
        write_fixture(args.out / name, Tokenizer.from_str(json.dumps(spec)), rng, with_tokens=False)
        print(f"{name}: derived from tiny", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
