#!/usr/bin/python3
"""Write corpus.txt: the tokenizer test corpus (deterministic; re-run to regenerate).

One sample per line, split on '\n' only (so '\r' and tabs stay inside lines).
Every line is valid UTF-8. Characters whose handling differs between Hugging
Face's Rust regex engine and the JavaScript reference (U+0085 NEL and U+FEFF,
which JS and Oniguruma disagree on for \\s) are left out; see docs/tokenizer.md.
Usage: gen_corpus.py [OUT]   (default: corpus.txt next to this script)
"""
import os
import random
import sys

R = random.Random(20240601)

EN = [
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times.",
    "Decode-first inference engines spend most of their time reading weights.",
    "She said, \"Don't worry; we'll fix it tomorrow.\"",
    "In 1969, Apollo 11 landed on the Moon after a 76-hour journey.",
    "Memory bandwidth, not arithmetic, bounds the speed of a single decode step.",
    "Why would anyone write a tokenizer in C? Because it's fast, and it's fun!",
    "The committee's report (pages 12-14) was published on 2023-07-15.",
    "Email me at someone@example.com or visit https://example.org/path?q=1&r=2#frag.",
    "He paid $1,234.56 for 3.5 kg of coffee -- a 12% discount!",
    "Mr. O'Neill and Ms. D'Angelo couldn't attend; they'd already left.",
    "Tokenization is the first and last step of every request.",
    "A stitch in time saves nine, or so they say.",
    "All models are wrong, but some are useful.",
    "Premature optimization is the root of all evil (or at least most of it).",
    "The mitochondria is the powerhouse of the cell.",
    "I'm sure you're right, but I've never seen it done that way.",
    "SHE'S HERE! THEY'LL SEE. WE'VE WON. YOU'RE LATE. I'M DONE. HE'D KNOW.",
    "She'S fine, They'Ll come, we'Ve seen, it'D do, I'M ok, you'Re up.",
    "Rock 'n' roll, 'twas the night, the '90s, 'quoted', and ''double''.",
    "Curly quotes: it\u2019s, they\u2019ll, we\u2019ve \u2014 and \u201cso on\u201d.",
    "Naïve café owners in Zürich serve crème brûlée to señoritas.",
    "The Straße in Köln is wider than the one in Mönchengladbach.",
    "Ångström, Øresund, Æsir, Þórr, and ðe olde ƿynn.",
    "Use the --verbose flag, or -v, to print more; -- ends the options.",
    "Temperature: -40°C equals -40°F; 100°C is 212°F.",
    "Fractions like ½, ¼ and ¾ are single characters, as is №.",
    "Hello,World!This:has;no spaces,after.punctuation?",
    "   Leading spaces and trailing spaces   ",
    "Numbers: 0, 7, 42, 1337, 65536, 3.14159265358979, 6.022e23, -0.0001.",
    "Version v1.2.3-rc.4+build.567 was tagged at 12:34:56.789Z.",
    "IPv4 192.168.0.1, IPv6 2001:db8::ff00:42:8329, MAC 00:1A:2B:3C:4D:5E.",
    "To be, or not to be, that is the question.",
    "Colorless green ideas sleep furiously.",
    "The year 2024 had 366 days; 2023 had 365.",
    "ALL CAPS SENTENCE WITH ACRONYMS LIKE NASA, HTTP, JSON AND GPU.",
    "camelCaseIdentifier snake_case_identifier SCREAMING_SNAKE kebab-case-word",
    "Ellipsis... and em—dash, en–dash, and a hyphen-minus.",
    "Tab\tseparated\tvalues\tin\ta\tline.",
    "Mixed\t \t whitespace \t\t  runs \t.",
]

ZH = [
    "我们今天去公园散步，天气非常好。",
    "人工智能正在改变世界的方方面面。",
    "这个模型的推理速度受限于内存带宽。",
    "他说：“明天见！”然后就走了。",
    "中华人民共和国成立于1949年10月1日。",
    "学而时习之，不亦说乎？有朋自远方来，不亦乐乎？",
    "请把这份文件翻译成英文，谢谢。",
    "北京、上海、广州和深圳是中国的一线城市。",
    "我喜欢吃饺子和包子，尤其是猪肉白菜馅的。",
    "机器学习模型需要大量的数据进行训练。",
    "繁體中文與簡體中文在字形上有所不同。",
    "长江是中国最长的河流，全长约6300公里。",
    "这是一个测试句子，包含标点符号：，。！？；：",
    "程序员在深夜调试代码，咖啡已经凉了。",
    "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。",
]

JA = [
    "今日はとても良い天気ですね。",
    "私は東京に住んでいます。",
    "この本を読んだことがありますか？",
    "カタカナのコンピューターとインターネット。",
    "日本語の文章には、ひらがな、カタカナ、漢字が混ざっています。",
    "吾輩は猫である。名前はまだ無い。",
    "新幹線は時速３２０キロで走ります。",
    "ありがとうございます！また明日。",
    "ｈａｌｆ　ｗｉｄｔｈ　と　ﾊﾝｶｸｶﾀｶﾅ　の混在テスト。",
    "おはようございます。今日も一日頑張りましょう。",
    "古池や蛙飛び込む水の音",
    "東京都渋谷区神南１－２－３",
]

KO = [
    "안녕하세요, 만나서 반갑습니다.",
    "저는 한국어를 공부하고 있어요.",
    "오늘 날씨가 정말 좋네요!",
    "서울은 대한민국의 수도입니다.",
    "이 문장은 토크나이저 테스트를 위한 것입니다.",
    "김치찌개와 된장찌개 중에 뭐 먹을래?",
    "한글은 세종대왕이 1443년에 창제했습니다.",
    "컴퓨터 프로그래밍은 재미있어요.",
    "감사합니다. 좋은 하루 되세요.",
    "대한민국 헌법 제1조 ① 대한민국은 민주공화국이다.",
]

AR = [
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "اللغة العربية جميلة جداً.",
    "القاهرة هي عاصمة مصر وأكبر مدنها.",
    "أحب القراءة والكتابة في أوقات الفراغ.",
    "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ",
    "الأرقام العربية: ٠١٢٣٤٥٦٧٨٩ والهندية ۰۱۲۳۴۵۶۷۸۹.",
    "هذا اختبار لمحلل الرموز.",
    "تعلم الآلة هو فرع من الذكاء الاصطناعي.",
    "السلام عليكم ورحمة الله وبركاته.",
    "في عام ٢٠٢٤ حدثت أشياء كثيرة.",
]

HI = [
    "नमस्ते, आप कैसे हैं?",
    "मैं हिंदी सीख रहा हूँ।",
    "भारत एक विशाल देश है।",
    "आज मौसम बहुत अच्छा है।",
    "यह वाक्य टोकनाइज़र परीक्षण के लिए है।",
    "दिल्ली भारत की राजधानी है।",
    "संस्कृत एक प्राचीन भाषा है।",
    "क़ख़ग़ज़ड़ढ़फ़य़ with nukta forms",
    "मुझे किताबें पढ़ना पसंद है।",
    "१२३४५६७८९० देवनागरी अंक",
]

OTHER = [
    "Привет, мир! Как дела? Всё хорошо.",
    "Москва — столица России. Ёлка, щука, объём.",
    "Γειά σου Κόσμε! Η γλώσσα είναι όμορφη. ΣΊΣΥΦΟΣ σίσυφος.",
    "שלום עולם, מה שלומך היום?",
    "สวัสดีครับ ยินดีที่ได้รู้จัก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Xin chào! Tiếng Việt có nhiều dấu thanh: à á ả ã ạ ằ ắ ẳ ẵ ặ.",
    "Türkçe: İstanbul, ığdır, şeker, çiçek, öğretmen, ünlü.",
    "Polski: Zażółć gęślą jaźń. Čeština: Příliš žluťoučký kůň.",
    "Ελληνικά με τόνους: ά έ ή ί ό ύ ώ ΐ ΰ",
    "ქართული ენა ლამაზია. Հայերեն լեզու. አማርኛ ቋንቋ።",
    "தமிழ் மொழி மிகவும் பழமையானது. বাংলা ভাষা সুন্দর। ਪੰਜਾਬੀ ਭਾਸ਼ਾ।",
    "Монгол хэл, Українська мова: ґанок, їжак, є, і.",
]

CODE = [
    "def fib(n: int) -> int:",
    "    return n if n < 2 else fib(n - 1) + fib(n - 2)",
    "for (size_t i = 0; i < n; i++) { sum += a[i] * b[i]; }",
    "#include <stdio.h>",
    "int main(int argc, char **argv) { printf(\"%d\\n\", argc); return 0; }",
    "const add = (a, b) => a + b; console.log(`sum=${add(1, 2)}`);",
    "fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!(\"{:?}\", v); }",
    "func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) }",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE 'A%' ORDER BY id DESC LIMIT 10;",
    "if [ -f \"$HOME/.bashrc\" ]; then . \"$HOME/.bashrc\"; fi && echo $? | tee -a log.txt",
    "<div class=\"container\"><p id='x'>Hello &amp; welcome</p></div>",
    "{\"key\": [1, 2.5, true, null, \"str\"], \"nested\": {\"a\": {\"b\": []}}}",
    "x = [i**2 for i in range(100) if i % 3 == 0]  # list comprehension",
    "template <typename T> T max(T a, T b) { return a > b ? a : b; }",
    "public static void main(String[] args) throws IOException {",
    "    System.out.println(\"Hello, World!\");",
    "SELECT COUNT(*) FROM orders o JOIN customers c ON o.cid = c.id GROUP BY c.country;",
    "while (( i < 10 )); do i=$((i+1)); done",
    "    if err != nil {\n        return nil, fmt.Errorf(\"open: %w\", err)",
    "let mut map: HashMap<String, Vec<&str>> = HashMap::new();",
    "@media (max-width: 600px) { .nav { display: none !important; } }",
    "regex = re.compile(r\"(?i)^\\s*([a-z_][a-z0-9_]*)\\s*=\\s*(.+?)\\s*$\")",
    "    // TODO(perf): avoid the copy; see issue #1234",
    "/* multi-line\n * comment\n */",
    "a+=b;c-=d;e*=f;g/=h;i%=j;k<<=1;l>>=2;m&=n;o|=p;q^=r;",
    "x->y->z = &arr[idx++]; *ptr-- = ~mask ^ 0xDEADBEEF;",
    "print(f\"{value!r:>10} {ratio:.2%} {count:,}\")",
    "git commit -m \"fix: handle CRLF in tokenizer\" && git push origin main",
    "docker run --rm -it -v $(pwd):/work -p 8080:80 nginx:1.25-alpine",
    "\tindented_with_tab = True",
    "\t\tdouble_tab_indent()",
    "        eight_space_indent()",
    "lambda x: (x, [x], {x: x}, {x})",
    "#!/usr/bin/env python3",
    "std::vector<std::pair<int, std::string>> v{{1, \"a\"}, {2, \"b\"}};",
    "impl<'a> Iterator for Tokens<'a> { type Item = &'a str; }",
    "matrix[i][j] = matrix[i-1][j-1] + 1 if s[i] == t[j] else 0",
    "$ curl -sSL https://example.com/install.sh | sh -s -- --yes",
]

SPECIAL = [
    "<|im_start|>user\nWhat is 2+2?<|im_end|>",
    "<|im_start|>assistant<|im_end|><|endoftext|>",
    "text before<|endoftext|>text after",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "partial <|im_ and <|im_end| and im_end|> are plain text",
    "<<|im_end|>> nested brackets around a special token",
    "<|im_start|><|im_start|><|im_end|><|im_end|>",
    "<|fim_prefix|>def f():<|fim_suffix|>    return 1<|fim_middle|>",
    "<|vision_start|><|image_pad|><|vision_end|> describe the image",
    "<|endoftext|>",
    "a<|im_end|>b<|im_end|>c",
    "<|IM_END|> is not special (case matters)",
    "<|endoftext|><|endoftext|>  <|endoftext|>",
]

EMOJI = [
    "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏴‍☠️", "👍🏻", "👍🏼", "👍🏽", "👍🏾", "👍🏿", "❤️", "🇺🇸", "🇯🇵", "🇩🇪",
    "1️⃣", "#️⃣", "🧑🏿‍🤝‍🧑🏻", "👨🏻‍❤️‍💋‍👨🏼", "🤷‍♀️", "🙋🏾‍♂️", "😀", "😂", "🥲", "🤖", "🚀", "🔥", "✨",
    "⭐", "☕", "🍣", "🐍", "🦀", "©️", "®️", "™️",
]

COMBINING = [
    "e\u0301 a\u0300 o\u0302 u\u0308 n\u0303 c\u0327",            # decomposed Latin -> NFC composes
    "Cafe\u0301 nai\u0308ve re\u0301sume\u0301",
    "\u212b \u2126 \u212a",                                          # Angstrom, Ohm, Kelvin signs -> letters
    "\u1112\u1161\u11ab\u1100\u1173\u11af",                           # conjoining jamo -> 한글
    "\u0915\u093c\u0916\u093c \u0921\u093c",                          # nukta: composition exclusions stay decomposed
    "\uf900\uf901\uf902 \u2f800",                                     # CJK compatibility ideographs -> unified
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319A\u0350L\u0357G\u0361O\u0362!",  # zalgo
    "a\u0328\u0301 q\u0307\u0323 s\u0323\u0307",                       # reordering of marks
    "\u1e9b\u0323 \u0041\u030a \u00c5",                               # long s with dots, A+ring vs Å
    "\u0627\u0653 \u0648\u0654 \u064a\u0654",                          # Arabic hamza/madda composition
    "\u304b\u3099 \u30cf\u309a \u30a6\u3099",                         # kana with combining voiced marks
    "\u0e01\u0e34\u0e4a \u0e40\u0e01\u0e49\u0e32",                   # Thai marks
    "x\u20d7 y\u20dd 1\u20e3",                                        # enclosing/vector marks
]

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact the of and to in is you that it he was for on are as with "
         "his they at be this have from or one had by word but not what all were we when your can said there use an "
         "each which she do how their if will up other about out many then them these so some her would make like "
         "him into has look two more write go see number no way could people my than first water been call who oil "
         "its now find long down day did get come made may part").split()


def rand_cp():
    ranges = [
        (0x21, 0x7e, 6), (0xa1, 0x24f, 3), (0x370, 0x3ff, 1), (0x400, 0x4ff, 2), (0x5d0, 0x5ea, 1),
        (0x620, 0x64a, 1), (0x660, 0x669, 1), (0x905, 0x939, 1), (0x966, 0x96f, 1), (0xe01, 0xe2e, 1),
        (0x1100, 0x1112, 1), (0x1e00, 0x1eff, 1), (0x2000, 0x206f, 1), (0x2070, 0x209c, 1), (0x20a0, 0x20bf, 1),
        (0x2100, 0x214f, 1), (0x2190, 0x21ff, 1), (0x2200, 0x22ff, 1), (0x2460, 0x24ff, 1), (0x2500, 0x257f, 1),
        (0x3001, 0x3003, 1), (0x3041, 0x3096, 2), (0x30a1, 0x30fa, 2), (0x4e00, 0x9fa5, 6), (0xac00, 0xd7a3, 3),
        (0xff01, 0xff5e, 1), (0x1f300, 0x1f5ff, 2), (0x1f600, 0x1f64f, 2), (0x1d400, 0x1d7ff, 1),
        (0x0300, 0x036f, 1), (0x20, 0x20, 8), (0x9, 0x9, 1), (0xa0, 0xa0, 1), (0x3000, 0x3000, 1),
    ]
    total = sum(w for _, _, w in ranges)
    x = R.uniform(0, total)
    for lo, hi, w in ranges:
        if x < w:
            cp = R.randint(lo, hi)
            break
        x -= w
    else:
        cp = 0x41
    # Skip characters the engines disagree on or that are not assigned everywhere.
    if cp in (0x85, 0xfeff, 0x180e) or 0x2065 == cp or 0x20c0 <= cp <= 0x20cf:
        return "?"
    return chr(cp)


def sample(pool, k):
    return [R.choice(pool) for _ in range(k)]


def line_prose(pool, sep=" "):
    return sep.join(sample(pool, R.randint(1, 3)))


def line_words():
    ws = []
    for _ in range(R.randint(3, 20)):
        w = R.choice(WORDS)
        r = R.random()
        if r < 0.1:
            w = w.upper()
        elif r < 0.2:
            w = w.capitalize()
        ws.append(w)
    s = " ".join(ws)
    return s + R.choice([".", "!", "?", ",", ";", "", "...", " -", ":)"])


def line_numbers():
    kind = R.randint(0, 7)
    if kind == 0:
        return str(R.randint(0, 10 ** R.randint(1, 40)))
    if kind == 1:
        return "%d.%0*d" % (R.randint(0, 99999), R.randint(1, 12), R.randint(0, 10 ** 10))
    if kind == 2:
        return "{:,}".format(R.randint(0, 10 ** 15))
    if kind == 3:
        return "+1 (%03d) %03d-%04d" % (R.randint(100, 999), R.randint(0, 999), R.randint(0, 9999))
    if kind == 4:
        return "%04d-%02d-%02dT%02d:%02d:%02d" % (R.randint(1900, 2100), R.randint(1, 12), R.randint(1, 28),
                                                  R.randint(0, 23), R.randint(0, 59), R.randint(0, 59))
    if kind == 5:
        return " ".join(str(R.randint(-1000, 100000)) for _ in range(R.randint(2, 12)))
    if kind == 6:
        return "0x%X 0b%s 0o%o %.6e" % (R.getrandbits(64), bin(R.getrandbits(20))[2:], R.getrandbits(30),
                                         R.uniform(-1e10, 1e10))
    return "".join(R.choice("0123456789") for _ in range(R.randint(50, 300)))


def line_whitespace():
    parts = []
    for _ in range(R.randint(1, 8)):
        parts.append(R.choice(WORDS + ["x", "1", "!", "中文", "é"]))
        parts.append("".join(R.choice([" ", " ", " ", "\t", "\u00a0", "\u3000", "\u2003", "\r", " \r", "\t\t"])
                             for _ in range(R.randint(1, 12))))
    s = "".join(parts)
    if R.random() < 0.3:
        s = " " * R.randint(1, 40) + s
    return s


def line_crlf():
    return line_prose(EN + CODE) + "\r"


def line_emoji():
    n = R.randint(1, 8)
    out = []
    for _ in range(n):
        out.append(R.choice(EMOJI))
        out.append(R.choice(["", " ", " ", "!", " and ", "", "\t"]))
    if R.random() < 0.5:
        out.insert(0, R.choice(EN) + " ")
    return "".join(out)


def line_long_word():
    k = R.randint(0, 9)
    if k == 0:
        return R.choice("abcxyz") * R.randint(100, 2000)
    if k == 1:
        return "supercalifragilisticexpialidocious" * R.randint(2, 40)
    if k == 2:
        return "https://example.com/" + "/".join(R.choice(WORDS) for _ in range(R.randint(20, 80))) + "?id=" + \
            "".join(R.choice("abcdef0123456789") for _ in range(64))
    if k == 3:
        return "".join(R.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
                       for _ in range(R.randint(100, 1500))) + "=="
    if k == 4:
        return "".join(R.choice(ZH)[:-1] for _ in range(R.randint(5, 25)))
    if k == 5:
        return " " * R.randint(50, 1200) + R.choice(["", "x", "\t"])
    if k == 6:
        return R.choice("!?.-=*#~_") * R.randint(20, 800)
    if k == 7:
        return "ab" * R.randint(50, 1000)
    if k == 8:
        return "Pneumonoultramicroscopicsilicovolcanoconiosis" + "".join(R.choice(WORDS) for _ in range(40))
    return "\U0001f600" * R.randint(10, 300)


def line_random():
    return "".join(rand_cp() for _ in range(R.randint(1, 80)))


def line_special():
    s = R.choice(SPECIAL)
    if R.random() < 0.5:
        s = R.choice(EN) + " " + s + " " + R.choice(ZH)
    return s.replace("\n", R.choice([" ", "\\n"]))


def line_mixed():
    pools = [EN, ZH, JA, KO, AR, HI, OTHER, CODE, EMOJI, COMBINING]
    return R.choice([" ", "", "\t", "  "]).join(R.choice(R.choice(pools)) for _ in range(R.randint(2, 5)))


def line_contractions():
    subj = ["I", "you", "he", "she", "it", "we", "they", "THEY", "We", "YOU", "John", "the dog"]
    suf = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'rE", "'VE", "'Ve", "'vE", "'M",
           "'LL", "'Ll", "'lL", "'D", "\u2019s", "'x", "''", "'", "'sss", "'lll"]
    return " ".join(R.choice(subj) + R.choice(suf) for _ in range(R.randint(2, 10))) + R.choice([".", "!", ""])


GENERATORS = [
    (lambda: line_prose(EN), 500), (line_words, 300), (lambda: line_prose(ZH, ""), 200),
    (lambda: line_prose(JA, ""), 150), (lambda: line_prose(KO), 150), (lambda: line_prose(AR), 120),
    (lambda: line_prose(HI), 120), (lambda: line_prose(OTHER), 150), (lambda: R.choice(CODE).replace("\n", " "), 300),
    (line_numbers, 200), (line_whitespace, 150), (line_crlf, 100), (line_emoji, 150), (line_long_word, 60),
    (line_random, 300), (line_special, 100), (line_mixed, 200), (line_contractions, 100),
    (lambda: R.choice(COMBINING), 60),
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.txt")
    lines = []
    # Every fixed sample once, then the generated ones in a seeded order.
    for pool in (EN, ZH, JA, KO, AR, HI, OTHER, CODE, SPECIAL, COMBINING):
        lines += [s.replace("\n", " ") for s in pool]
    lines.append(" ".join(EMOJI))
    for gen, n in GENERATORS:
        lines += [gen() for _ in range(n)]
    head, tail = lines[:len(lines) // 10], lines[len(lines) // 10:]
    R.shuffle(tail)
    lines = head + tail
    lines = [s.replace("\n", " ") for s in lines]  # newlines live in the whole-file test, not inside a line
    for s in lines:
        s.encode("utf-8")
    with open(out, "w", encoding="utf-8", newline="") as f:
        for s in lines:
            f.write(s + "\n")
    print("%s: %d lines, %d bytes" % (out, len(lines), os.path.getsize(out)))


if __name__ == "__main__":
    main()
