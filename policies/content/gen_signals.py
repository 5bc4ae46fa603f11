#!/usr/bin/env python3
"""Writes src/signals.rs: the content policy's phrase table, normalised and sorted.

Edit the lists below, then run `python3 gen_signals.py`. The policy looks a phrase
up by the FNV-1a hash of its bytes (binary search over sorted hashes, then a string
compare); a unit test checks the tables against the phrases.
Normalisation here must match `normalize` in src/lib.rs: lowercase, Latin accents
and Arabic diacritics/letter variants folded, words split on anything that is not a
letter or digit, '%' kept as a word of its own.
"""
import unicodedata, pathlib

# (category, weight, phrases). Categories: promo (promotional/marketing), cta (a call
# to buy: promotional, and it cancels the transactional discount), outreach (cold
# outreach), political (campaigning), civic (election words that alone are not
# campaigning), bulk (bulk-campaign signs), anchor (transactional context: lowers
# promotional weight when no call to buy is present).
SIGNALS = [
  ("promo", 30, ["% off", "black friday", "cyber monday", "flash sale", "mega sale", "big sale", "summer sale",
                 "clearance", "promo code", "coupon code", "discount code", "special offer", "exclusive offer",
                 "limited time offer", "limited time", "best price", "lowest price", "lowest prices", "bogo",
                 "buy one get one", "free gift", "new collection", "save up to", "up to 50", "up to 70",
                 "while stocks last", "while supplies last", "huge sale", "today only", "this weekend only",
                 "this week only", "one day only",
                 # es
                 "codigo promocional", "codigo de descuento", "oferta especial", "oferta exclusiva", "rebajas",
                 "liquidacion", "tiempo limitado", "precio especial", "dos por uno", "2x1", "nueva coleccion",
                 "hasta 50", "gran venta", "solo hoy", "solo por hoy",
                 # pt
                 "codigo promocional", "cupom de desconto", "oferta especial", "oferta exclusiva", "queima de estoque",
                 "liquidacao", "por tempo limitado", "tempo limitado", "preco especial", "leve 2 pague 1",
                 "nova colecao", "imperdivel", "ate 50", "so hoje", "somente hoje",
                 # ar
                 "كود خصم", "كود الخصم", "عرض خاص", "عروض", "تخفيضات", "لفتره محدوده", "الجمعه السوداء", "تنزيلات",
                 "كوبون"]),
  ("promo", 20, ["discount", "discounts", "sale", "promo", "promotion", "coupon", "deal", "deals", "offer", "offers",
                 "cashback", "free shipping", "voucher",
                 "descuento", "descuentos", "oferta", "ofertas", "promocion", "promociones", "cupon", "envio gratis",
                 "desconto", "descontos", "promocao", "promocoes", "cupom", "frete gratis",
                 "خصم", "تخفيض", "عرض", "مجانا"]),
  ("cta", 25, ["buy now", "shop now", "order now", "book now", "get yours", "claim your", "use code", "use the code",
               "don t miss", "dont miss", "last chance", "hurry", "act now", "grab yours", "visit our store",
               "your next order", "your next purchase", "next purchase",
               "compra ahora", "compre ya", "no te lo pierdas", "ultima oportunidad", "aprovecha", "usa el codigo",
               "tu proxima compra", "visita nuestra tienda",
               "compre agora", "nao perca", "ultima chance", "aproveite", "use o cupom", "use o codigo",
               "sua proxima compra", "visite nossa loja",
               "اشتر الان", "تسوق الان", "اطلب الان", "لا تفوت", "استخدم الكود", "اخر فرصه", "سارع"]),
  ("outreach", 35, ["we came across your", "i came across your", "are you interested in", "would you be interested",
                    "grow your business", "increase your sales", "boost your sales", "we help businesses",
                    "we help companies", "partnership opportunity", "book a demo", "schedule a call", "quick call",
                    "i d love to show you", "limited spots", "your website", "more customers", "generate leads",
                    "te interesa", "le interesa", "haz crecer tu negocio", "aumenta tus ventas",
                    "oportunidad de negocio", "agenda una llamada", "mas clientes",
                    "tem interesse", "aumente suas vendas", "alavancar seu negocio", "oportunidade de negocio",
                    "agende uma reuniao", "mais clientes", "encontramos seu",
                    "هل انت مهتم", "زياده مبيعاتك", "فرصه عمل", "عملاء اكثر"]),
  ("political", 70, ["vote for", "vote yes on", "vote no on", "re elect", "reelect", "support our candidate",
                     "our candidate", "donate to the campaign", "donate to our campaign", "paid for by",
                     "get out the vote", "elect", "campaign contribution",
                     "vota por", "votar por", "nuestro candidato", "reelegir", "reeleccion", "dona a la campana",
                     "vote em", "vote no candidato", "nosso candidato", "reeleger", "reeleicao", "doe para a campanha",
                     "numero do candidato", "vote 13", "vote 22",
                     "صوتوا ل", "صوت ل", "انتخبوا", "مرشحنا", "ادعم المرشح", "ادعموا"]),
  ("political", 25, ["candidate", "campaign rally", "rally", "political party", "our party", "party manifesto",
                     "campana electoral", "campanha eleitoral", "partido", "candidato", "comicio",
                     "الحمله الانتخابيه", "حزب", "المرشح"]),
  ("civic", 5, ["election", "elections", "ballot", "ballots", "polling station", "polling place", "polls", "vote",
                "voters", "eleccion", "elecciones", "votacion", "eleicao", "eleicoes", "urna", "votacao", "انتخابات",
                "الانتخابات", "اقتراع"]),
  ("bulk", 30, ["reply stop to", "text stop to", "to unsubscribe", "unsubscribe", "opt out", "dear valued customer",
                "forward this to", "share with your friends", "share this message", "link in bio",
                "para darte de baja", "responde baja", "comparte con tus amigos", "reenvia este mensaje",
                "para sair responda", "responda sair", "compartilhe com seus amigos", "encaminhe esta mensagem",
                "شارك مع اصدقائك", "ارسلها لاصدقائك", "لالغاء الاشتراك"]),
  ("bulk", 15, ["dear customer", "hello dear", "click here", "click the link", "tap the link", "estimado cliente",
                "querido cliente", "haz clic aqui", "prezado cliente", "caro cliente", "clique aqui", "عزيزي العميل",
                "اضغط هنا"]),
  ("anchor", 0, ["your order", "order number", "order #", "invoice", "receipt", "payment", "refund", "refunded",
                 "shipped", "delivered", "tracking", "was applied", "has been applied", "been applied", "your booking",
                 "your reservation", "your appointment", "your account", "your subscription", "your ticket",
                 "tu pedido", "su pedido", "factura", "recibo", "pago", "reembolso", "enviado", "entregado",
                 "seguimiento", "aplicado", "tu reserva", "tu cita",
                 "seu pedido", "nota fiscal", "fatura", "pagamento", "entregue", "rastreio", "rastreamento",
                 "aplicado", "sua reserva", "sua consulta", "agendamento",
                 "طلبك", "فاتوره", "الدفع", "تم الشحن", "تم التوصيل", "استرداد", "موعدك", "حجزك"]),
]

def fold(s):
    s = s.lower()
    out = []
    for ch in s:
        if "\u064b" <= ch <= "\u065f" or ch in "\u0670\u0640":
            continue
        ch = {"أ": "ا", "إ": "ا", "آ": "ا", "ى": "ي", "ة": "ه", "ؤ": "و", "ئ": "ي"}.get(ch, ch)
        if ord(ch) < 0x250:
            d = unicodedata.normalize("NFD", ch)
            ch = "".join(c for c in d if not unicodedata.combining(c))
        out.append(ch)
    return "".join(out)

def normalize(s):
    words, cur = [], []
    for ch in fold(s):
        if ch.isalnum():
            cur.append(ch)
        else:
            if cur: words.append("".join(cur)); cur = []
            if ch == "%": words.append("%")
    if cur: words.append("".join(cur))
    return " ".join(words)

table = {}
for cat, weight, phrases in SIGNALS:
    for p in phrases:
        n = normalize(p)
        assert n, p
        prev = table.get(n)
        if prev and prev != (cat, weight):
            # the same words in two languages: keep the heavier reading
            if prev[1] >= weight: continue
        table[n] = (cat, weight)

def fnv1a(data, h=0xcbf29ce484222325):
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h

rows = sorted(((fnv1a(k.encode()), k, v) for k, v in table.items()))
assert len({h for h, _, _ in rows}) == len(rows), "hash collision: change a phrase"
starts = sorted({fnv1a(k.split(" ")[0].encode()) for k in table})
longest = max(len(k.split(" ")) for k in table)

def open_table(hashes, size):
    """Open addressing, linear probing from hash % size; 0 marks an empty slot."""
    slots = [0] * size
    for h in hashes:
        i = h % size
        while slots[i]:
            i = (i + 1) % size
        slots[i] = h
    return slots

SLOTS = 1024   # power of two, at least three times the entries: short probes
assert len(rows) * 3 <= SLOTS and len(starts) * 3 <= SLOTS
phrase_index = {h: i for i, (h, _, _) in enumerate(rows)}
phrase_slots = open_table([h for h, _, _ in rows], SLOTS)
start_slots = open_table(starts, SLOTS)
cats = {"promo": "Promo", "cta": "CallToBuy", "outreach": "Outreach", "political": "Political", "civic": "Civic",
        "bulk": "Bulk", "anchor": "Anchor"}
lines = ["//! Generated by `gen_signals.py` (edit the lists there and run it): every phrase the",
         "//! content policy looks for, normalised, keyed by the FNV-1a hash of its bytes in",
         "//! open-addressing tables (linear probing from `hash % SLOTS`, 0 for an empty slot).",
         "",
         "use crate::Category;",
         "",
         "/// Words in the longest phrase.",
         f"pub const LONGEST: usize = {longest};",
         "",
         "/// Slots of each table (a power of two).",
         f"pub const SLOTS: usize = {SLOTS};",
         "",
         "/// (hash, phrase, category, weight), sorted by hash.",
         "pub static PHRASES: &[(u64, &str, Category, u8)] = &["]
for h, k, (c, w) in rows:
    lines.append(f"    (0x{h:016x}, {k!r}, Category::{cats[c]}, {w}),".replace("'", '"'))
lines.append("];")
lines.append("")
lines.append("/// The hash of each phrase at its slot, and the phrase's index in `PHRASES` + 1.")
lines.append(f"pub static PHRASE_SLOTS: [(u64, u16); SLOTS] = [")
for h in phrase_slots:
    lines.append(f"    (0x{h:016x}, {phrase_index[h] + 1 if h else 0}),")
lines.append("];")
lines.append("")
lines.append("/// The hashes of the words phrases start with, at their slots.")
lines.append("pub static START_SLOTS: [u64; SLOTS] = [")
for h in start_slots:
    lines.append(f"    0x{h:016x},")
lines.append("];")
pathlib.Path(__file__).with_name("src").joinpath("signals.rs").write_text("\n".join(lines) + "\n")
print(len(rows), "phrases,", len(starts), "first words, longest", longest)
