"""The byte-level BPE tokenizer: special ids, any text encodes, save/load round trip."""

from ddtree.training.tokenizer import EOS, MASK, PAD, encode_documents, load_tokenizer, train_tokenizer

TEXTS = ["def add(a, b):\n    return a + b\n", "class Point:\n    x: int = 0\n"] * 10


def test_specials_come_first_and_text_round_trips(tmp_path):
    tok = train_tokenizer(TEXTS, vocab_size=300)
    assert (tok.eos_token_id, tok.pad_token_id, tok.mask_token_id) == (0, 1, 2)
    assert tok.convert_ids_to_tokens([0, 1, 2]) == [EOS, PAD, MASK]
    text = "def  ünïcode(x):\n\treturn x  # never seen\n"
    assert tok.decode(tok.encode(text)) == text
    tok.save_pretrained(str(tmp_path))
    again = load_tokenizer(tmp_path)
    assert again.encode(text) == tok.encode(text) and again.mask_token_id == 2 and len(again) == len(tok)


def test_documents_end_in_eos():
    tok = train_tokenizer(TEXTS, vocab_size=300)
    docs = encode_documents(tok, ["a = 1\n", "b = 2\n"])
    assert all(d[-1] == tok.eos_token_id and tok.eos_token_id not in d[:-1] for d in docs)
