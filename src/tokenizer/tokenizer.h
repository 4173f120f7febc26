/* Tokenizer: byte-level BPE (GPT-2 / Qwen2 / Llama-3) and SentencePiece-style BPE
 * (GGUF "llama"), a streaming UTF-8-safe detokenizer, and chat formatting.
 *
 * Ids match Hugging Face `tokenizers` token for token. A tk_tokenizer is
 * immutable after load and safe to share between threads; a tok_stream belongs
 * to one request (one thread). Every loader fails with TK_ERR_FORMAT /
 * TK_ERR_UNSUPPORTED and a one-line message on a bad file, never a silent fallback.
 */
#ifndef TK_TOKENIZER_H
#define TK_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "tokamak.h"

typedef struct tk_tokenizer tk_tokenizer;

/* Load from GGUF metadata (tokenizer.ggml.*). Copies everything it keeps, so f
 * may be closed afterwards. Free with tok_free. */
tk_status tok_load_gguf(const gguf_file *f, tk_tokenizer **out);
/* dir: a directory holding tokenizer.json (and optionally tokenizer_config.json). */
tk_status tok_load_hf(const char *dir, tk_tokenizer **out);
/* json: tokenizer.json text (len bytes); config_json: tokenizer_config.json text
 * (NUL-terminated) or NULL. */
tk_status tok_load_json(const char *json, size_t len, const char *config_json /*NULL ok*/,
                        tk_tokenizer **out);
/* path: a directory with tokenizer.json, a tokenizer.json file (tokenizer_config.json
 * beside it is read too), or a GGUF model. */
tk_status tok_load_path(const char *path, tk_tokenizer **out);
void tok_free(tk_tokenizer *t); /* NULL is a no-op */

int tok_n_vocab(const tk_tokenizer *t);
/* Most ids tok_encode can write for text_len bytes (with BOS). */
size_t tok_encode_bound(const tk_tokenizer *t, size_t text_len);
/* add_bos: prepend BOS if the vocabulary asks for it; parse_special: special tokens
 * written in text become their ids (false: they are text; non-special added tokens
 * match either way). Never encode a chat built from user text with parse_special:
 * use tok_chat_encode. Invalid UTF-8 is encoded as U+FFFD. TK_ERR_RANGE if cap is too small
 * (size with tok_encode_bound). Thread-safe. */
tk_status tok_encode(const tk_tokenizer *t, const char *text, size_t len, bool add_bos, bool parse_special,
                     int32_t *ids, size_t cap, size_t *n_out);
bool tok_is_eog(const tk_tokenizer *t, int32_t id); /* end of generation: eos, <|im_end|>, <|eot_id|>, ... */
int32_t tok_bos(const tk_tokenizer *t);             /* -1 if none */
int32_t tok_eos(const tk_tokenizer *t);             /* -1 if none */

/* Raw vocabulary, for writing GGUF (synth): piece bytes as stored in the vocab, token type
 * (GGUF tokenizer.ggml.token_type values: 1 normal, 2 unknown, 3 control, 4 user-defined,
 * 5 unused, 6 byte). Out-of-range ids give NULL / 0. */
const char *tok_piece(const tk_tokenizer *t, int32_t id, size_t *len);
int tok_token_type(const tk_tokenizer *t, int32_t id);
int64_t tok_n_merges(const tk_tokenizer *t);
void tok_merge(const tk_tokenizer *t, int64_t i, const char **a, size_t *alen, const char **b, size_t *blen);
const char *tok_model_name(const tk_tokenizer *t); /* "gpt2" | "llama" */
const char *
tok_pre_name(const tk_tokenizer *t); /* "qwen2" | "llama-bpe" | "gpt2" | ... (GGUF tokenizer.ggml.pre) */
const char *tok_chat_template(const tk_tokenizer *t); /* raw template text or NULL */

/* Streaming detokenizer (one per request, one thread). push/flush write at most
 * tok_stream_bound bytes of complete UTF-8; bytes of an unfinished character are
 * held back until the next push; flush emits what is left (invalid -> U+FFFD). */
typedef struct tok_stream tok_stream;
tk_status tok_stream_init(const tk_tokenizer *t, bool show_special, tok_stream **out);
void tok_stream_free(tok_stream *s);
size_t tok_stream_bound(const tk_tokenizer *t); /* max bytes one push/flush can write */
size_t tok_stream_push(tok_stream *s, int32_t id, char *out, size_t cap); /* complete UTF-8 only */
size_t tok_stream_flush(tok_stream *s, char *out, size_t cap);

/* A conversation in the chat format recognised from the model's template
 * (Qwen3, Llama-3, plain ChatML fallback; no template code is evaluated),
 * encoded to prompt ids: BOS where the vocabulary asks for it, then the turns.
 * Only the format's own markers become control tokens; a special token written
 * in a message is encoded as text, while non-special added tokens (Qwen3's
 * <think>, <tool_call>) keep their ids as Hugging Face encodes them. Roles:
 * system, user, assistant, tool (others: TK_ERR_INVALID). *ids is tk_malloc'd
 * (free with tk_free). Thread-safe. */
tk_status tok_chat_encode(const tk_tokenizer *t, const tk_chat_message *msgs, int n,
                          bool add_generation_prompt, bool enable_thinking, int32_t **ids, size_t *n_ids);
/* The family tok_chat_encode writes: "qwen3", "llama3" or "chatml". */
const char *tok_chat_family(const tk_tokenizer *t);

#endif
