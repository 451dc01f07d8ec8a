/* Private helpers of the tokenizer modules: growable buffers, UTF-8, hashing. */
#ifndef LMX_TOK_UTIL_H
#define LMX_TOK_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* A growable byte buffer; p is malloc'd and owned by the buffer. */
typedef struct lmx_tokbuf {
    char *p;
    size_t n, cap;
} lmx_tokbuf;

/* Each returns 0, or -1 when memory runs out (the buffer is then unchanged). */
int lmx_tokbuf_reserve(lmx_tokbuf *b, size_t extra);
int lmx_tokbuf_put(lmx_tokbuf *b, const void *s, size_t n);
int lmx_tokbuf_putc(lmx_tokbuf *b, char c);
int lmx_tokbuf_putcp(lmx_tokbuf *b, uint32_t cp); /* a code point as UTF-8 */
void lmx_tokbuf_free(lmx_tokbuf *b);

/* A growable array of int32 (token ids). */
typedef struct lmx_tokids {
    int32_t *p;
    size_t n, cap;
} lmx_tokids;
int lmx_tokids_push(lmx_tokids *v, int32_t id);

/* Length of the well-formed UTF-8 character at s (1..4), 0 if the bytes
 * there do not start one; *cp gets the code point. */
size_t lmx_tokutf8_next(const unsigned char *s, size_t n, uint32_t *cp);
/* Length of the "maximal subpart" at s, a byte sequence that is not a whole
 * character: what one U+FFFD replaces (Unicode 6.0 best practice, as Rust's
 * from_utf8_lossy and Python's errors='replace'). n > 0. */
size_t lmx_tokutf8_bad_len(const unsigned char *s, size_t n);
/* 1 if s[0..n) is well-formed UTF-8. */
int lmx_tokutf8_valid(const char *s, size_t n);
/* Appends s with every ill-formed subpart replaced by U+FFFD. */
int lmx_tokutf8_lossy(lmx_tokbuf *out, const char *s, size_t n);
/* Encodes cp into out (4 bytes room); returns its length. */
size_t lmx_tokutf8_encode(uint32_t cp, char *out);

/* Unicode classes as Rust's char methods and regex crate see them. */
int lmx_tokuni_is_whitespace(uint32_t cp); /* White_Space property */
int lmx_tokuni_is_word(uint32_t cp);       /* regex \w: L, M, Nd, Nl, Pc, join controls */
int lmx_tokuni_is_numeric(uint32_t cp);    /* Nd, Nl, No */

uint64_t lmx_tokhash(const void *s, size_t n);

#endif
