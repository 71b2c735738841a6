/* The remoting codec's hot loop in C: frames out of a byte buffer with their msgpack (type 2) and
 * JSON (type 0) headers, and the prefix + header of an outgoing command.
 *
 * smartgo/net/frame.py and smartgo/net/headers.py are the reference: this module takes only the
 * common, well-formed case and gives exactly what they give for it (the tests feed both the same
 * inputs, garbled ones included). Anything else - a ROCKETMQ binary header, a header value that
 * is not a string, a float, a surrogate escape, invalid UTF-8, a syntax error - goes to the
 * Python decoder or encoder, which then decides, so every error reads as it does there. It holds
 * no state between calls (sans-IO, like the Python codec). Why C: on the two-core machine the
 * codec was a quarter of a net actor's and a third of a client's CPU a synchronous send.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* set by configure() */
static PyObject *Command;        /* smartgo.net.command.RemotingCommand */
static PyObject *FrameErrorT;
static PyObject *DecoderOf[256]; /* serialize type -> Python header decoder (the fallback) */
static PyObject *Languages;      /* language name -> code */
static PyObject *OtherLanguage;  /* LanguageCode.OTHER: an unknown name */
static PyObject *JavaLanguage;   /* what a JSON header without "language" means */
static PyObject *LanguageNames;  /* code -> name, for JSON output */
static PyObject *Inflate;        /* inflate(cmd, max_frame): a compressed SmartGo body */
static PyObject *TypeJson, *TypeMsgpack;   /* SerializeType.JSON, SerializeType.MSGPACK */
static long CompressedMask;      /* FLAG_COMPRESSED | FLAG_SMARTGO */
/* RemotingCommand's slot descriptors, in constructor order: a command is made and read through
 * them (a dataclass __init__ in Python was a quarter of a decode) */
enum { F_CODE, F_LANGUAGE, F_VERSION, F_OPAQUE, F_FLAG, F_REMARK, F_EXT, F_BODY, F_STYPE, N_FIELDS };
static PyObject *Slot[N_FIELDS];

static PyObject *S_code, *S_language, *S_version, *S_opaque, *S_flag, *S_remark, *S_ext_fields,
    *S_body, *S_serialize_type, *S_true, *S_false, *S_zero;

#define JSON 0
#define MSGPACK 2
#define I32_MIN (-2147483647LL - 1)
#define I32_MAX 2147483647LL

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint16_t be16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }

static inline uint64_t be64(const unsigned char *p) {
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

/* ---- decoded header fields ------------------------------------------------------------------- */

typedef struct {
    long long code, version, opaque, flag;
    PyObject *language;   /* new reference */
    PyObject *remark;     /* new reference (None included) */
    PyObject *ext;        /* new reference (None included) */
} Fields;

static void fields_clear(Fields *f) {
    Py_CLEAR(f->language);
    Py_CLEAR(f->remark);
    Py_CLEAR(f->ext);
}

static inline int int32_ok(long long v) { return v >= I32_MIN && v <= I32_MAX; }

/* A language given by name: its code, or LanguageCode.OTHER (headers._language). NULL on error. */
static PyObject *language_named(PyObject *name) {
    PyObject *code = PyDict_GetItemWithError(Languages, name);
    if (code == NULL) {
        if (PyErr_Occurred())
            return NULL;
        code = OtherLanguage;
    }
    Py_INCREF(code);
    return code;
}

/* ---- msgpack (type 2) ------------------------------------------------------------------------ */
/* Each reader returns 1 (read), 0 (not this case: the Python decoder decides) or -1 (error). */

typedef struct {
    const unsigned char *p, *end;
} Reader;

static int mp_int(Reader *r, long long *out) {
    const unsigned char *p = r->p;
    if (p >= r->end)
        return 0;
    unsigned char t = *p;
    Py_ssize_t need;
    if (t <= 0x7f) { *out = t; r->p = p + 1; return 1; }
    if (t >= 0xe0) { *out = (signed char)t; r->p = p + 1; return 1; }
    switch (t) {
    case 0xcc: case 0xd0: need = 1; break;
    case 0xcd: case 0xd1: need = 2; break;
    case 0xce: case 0xd2: need = 4; break;
    case 0xcf: case 0xd3: need = 8; break;
    default: return 0;
    }
    if (r->end - p - 1 < need)
        return 0;
    p++;
    switch (t) {
    case 0xcc: *out = p[0]; break;
    case 0xcd: *out = be16(p); break;
    case 0xce: *out = be32(p); break;
    case 0xcf: { uint64_t u = be64(p); if (u > (uint64_t)INT64_MAX) return 0; *out = (long long)u; break; }
    case 0xd0: *out = (signed char)p[0]; break;
    case 0xd1: *out = (int16_t)be16(p); break;
    case 0xd2: *out = (int32_t)be32(p); break;
    default: *out = (long long)be64(p); break;
    }
    r->p = p + need;
    return 1;
}

/* A str (not bin): its UTF-8 bytes, unchecked. */
static int mp_str_bytes(Reader *r, const char **s, Py_ssize_t *n) {
    const unsigned char *p = r->p;
    if (p >= r->end)
        return 0;
    unsigned char t = *p;
    Py_ssize_t len, head;
    if ((t & 0xe0) == 0xa0) { len = t & 0x1f; head = 1; }
    else if (t == 0xd9 && r->end - p >= 2) { len = p[1]; head = 2; }
    else if (t == 0xda && r->end - p >= 3) { len = be16(p + 1); head = 3; }
    else if (t == 0xdb && r->end - p >= 5) { len = be32(p + 1); head = 5; }
    else return 0;
    if (r->end - p - head < len)
        return 0;
    *s = (const char *)p + head;
    *n = len;
    r->p = p + head + len;
    return 1;
}

/* A str decoded as msgpack's raw=False does (strict UTF-8); invalid UTF-8 is the fallback's. */
static int mp_str(Reader *r, PyObject **out) {
    const char *s;
    Py_ssize_t n;
    int got = mp_str_bytes(r, &s, &n);
    if (got <= 0)
        return got;
    *out = PyUnicode_DecodeUTF8(s, n, NULL);
    if (*out == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static int mp_nil(Reader *r) {
    if (r->p < r->end && *r->p == 0xc0) {
        r->p++;
        return 1;
    }
    return 0;
}

/* extFields: nil or a map of str to str. */
static int mp_ext(Reader *r, PyObject **out) {
    if (mp_nil(r)) {
        *out = Py_NewRef(Py_None);
        return 1;
    }
    const unsigned char *p = r->p;
    if (p >= r->end)
        return 0;
    unsigned char t = *p;
    Py_ssize_t n;
    if ((t & 0xf0) == 0x80) { n = t & 0x0f; r->p = p + 1; }
    else if (t == 0xde && r->end - p >= 3) { n = be16(p + 1); r->p = p + 3; }
    else if (t == 0xdf && r->end - p >= 5) { n = be32(p + 1); r->p = p + 5; }
    else return 0;
    if (n > (r->end - r->p) / 2)   /* each entry takes at least two bytes */
        return 0;
    PyObject *d = PyDict_New();
    if (d == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = NULL, *v = NULL;
        int got = mp_str(r, &k);
        if (got == 1)
            got = mp_str(r, &v);
        if (got == 1 && PyDict_SetItem(d, k, v) < 0)
            got = -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (got != 1) {
            Py_DECREF(d);
            return got;
        }
    }
    *out = d;
    return 1;
}

/* [code, language, version, opaque, flag, remark, extFields] (headers.encode_msgpack_header). */
static int msgpack_fields(const unsigned char *p, Py_ssize_t n, Fields *f) {
    Reader r = {p, p + n};
    long long language;
    int got;
    if (n < 1 || *p != 0x97)
        return 0;
    r.p++;
    if (mp_int(&r, &f->code) != 1)
        return 0;
    if (r.p < r.end && ((*r.p & 0xe0) == 0xa0 || *r.p == 0xd9 || *r.p == 0xda || *r.p == 0xdb)) {
        PyObject *name;
        got = mp_str(&r, &name);
        if (got != 1)
            return got;
        f->language = language_named(name);
        Py_DECREF(name);
        if (f->language == NULL)
            return -1;
    } else {
        if (mp_int(&r, &language) != 1)
            return 0;
        if ((f->language = PyLong_FromLongLong(language)) == NULL)
            return -1;
    }
    if (mp_int(&r, &f->version) != 1 || mp_int(&r, &f->opaque) != 1 || mp_int(&r, &f->flag) != 1)
        return 0;
    if (mp_nil(&r))
        f->remark = Py_NewRef(Py_None);
    else if ((got = mp_str(&r, &f->remark)) != 1)
        return got;
    if ((got = mp_ext(&r, &f->ext)) != 1)
        return got;
    return r.p == r.end;   /* trailing bytes: msgpack's ExtraData */
}

/* ---- JSON (type 0) --------------------------------------------------------------------------- */

static inline void json_ws(Reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static int hex4(const unsigned char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return 0;
        v = (v << 4) | d;
    }
    *out = v;
    return 1;
}

/* A string at r->p (the opening quote) as json's strict scanner decodes it. Surrogate escapes
 * (which Python pairs or keeps alone) and anything invalid are the fallback's. */
static int json_str(Reader *r, PyObject **out) {
    const unsigned char *p = r->p + 1, *end = r->end, *start = p;
    int escaped = 0;
    if (r->p >= end || *r->p != '"')
        return 0;
    while (p < end && *p != '"') {
        if (*p < 0x20)
            return 0;
        if (*p == '\\') {
            escaped = 1;
            p += 2;
        } else {
            p++;
        }
    }
    if (p >= end)
        return 0;
    if (!escaped) {
        *out = PyUnicode_DecodeUTF8((const char *)start, p - start, NULL);
    } else {
        /* unescape into UTF-8; escapes never produce a continuation byte first, so invalid raw
         * UTF-8 stays invalid and the decode below refuses it as Python's would */
        Py_ssize_t cap = p - start;
        char *buf = PyMem_Malloc(cap > 0 ? cap : 1), *o = buf;
        const unsigned char *q = start;
        if (buf == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        while (q < p) {
            if (*q != '\\') {
                *o++ = (char)*q++;
                continue;
            }
            unsigned c = q[1], u;
            q += 2;
            switch (c) {
            case '"': case '\\': case '/': *o++ = (char)c; break;
            case 'b': *o++ = '\b'; break;
            case 'f': *o++ = '\f'; break;
            case 'n': *o++ = '\n'; break;
            case 'r': *o++ = '\r'; break;
            case 't': *o++ = '\t'; break;
            case 'u':
                if (p - q < 4 || !hex4(q, &u) || (u >= 0xd800 && u <= 0xdfff)) {
                    PyMem_Free(buf);
                    return 0;
                }
                q += 4;
                if (u < 0x80) {
                    *o++ = (char)u;
                } else if (u < 0x800) {
                    *o++ = (char)(0xc0 | (u >> 6));
                    *o++ = (char)(0x80 | (u & 0x3f));
                } else {
                    *o++ = (char)(0xe0 | (u >> 12));
                    *o++ = (char)(0x80 | ((u >> 6) & 0x3f));
                    *o++ = (char)(0x80 | (u & 0x3f));
                }
                break;
            default:
                PyMem_Free(buf);
                return 0;
            }
        }
        *out = PyUnicode_DecodeUTF8(buf, o - buf, NULL);
        PyMem_Free(buf);
    }
    if (*out == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    r->p = p + 1;
    return 1;
}

/* An integer token (no fraction, no exponent: those are floats, the fallback's). Sets *text and
 * *len to the token; *value when it fits 18 digits, else *big. */
static int json_int(Reader *r, long long *value, int *big, const char **text, Py_ssize_t *len) {
    const unsigned char *p = r->p, *end = r->end, *digits;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    digits = p;
    if (p >= end || *p < '0' || *p > '9')
        return 0;
    if (*p == '0') {
        p++;
    } else {
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E' || (*p >= '0' && *p <= '9')))
        return 0;
    *text = (const char *)r->p;
    *len = p - r->p;
    *big = p - digits > 18;
    if (!*big) {
        long long v = 0;
        for (const unsigned char *q = digits; q < p; q++)
            v = v * 10 + (*q - '0');
        *value = neg ? -v : v;
    }
    r->p = p;
    return 1;
}

static int json_word(Reader *r, const char *word, Py_ssize_t n) {
    if (r->end - r->p >= n && memcmp(r->p, word, n) == 0) {
        r->p += n;
        return 1;
    }
    return 0;
}

/* A header field that must be an integer (split checks its 32-bit range, as headers._int32). */
static int json_int_field(Reader *r, long long *out) {
    const char *text;
    Py_ssize_t len;
    int big;
    return json_int(r, out, &big, &text, &len) == 1 && !big;
}

/* A value of a field the header does not read: it must still be valid. */
static int json_skip(Reader *r) {
    long long v;
    const char *text;
    Py_ssize_t len;
    int big;
    if (r->p >= r->end)
        return 0;
    if (*r->p == '"') {
        PyObject *s;
        int got = json_str(r, &s);
        if (got == 1)
            Py_DECREF(s);
        return got;
    }
    if (json_word(r, "true", 4) || json_word(r, "false", 5) || json_word(r, "null", 4))
        return 1;
    return json_int(r, &v, &big, &text, &len);
}

/* extFields: null or an object of string keys; values as headers._normalize_ext gives them
 * (a number or boolean as Java's toString() writes it, a null dropped). */
static int json_ext(Reader *r, PyObject **out) {
    int got = 0, nulls = 0;
    if (json_word(r, "null", 4)) {
        *out = Py_NewRef(Py_None);
        return 1;
    }
    if (r->p >= r->end || *r->p != '{')
        return 0;
    r->p++;
    PyObject *d = PyDict_New();
    if (d == NULL)
        return -1;
    json_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        *out = d;
        return 1;
    }
    for (;;) {
        PyObject *k = NULL, *v = NULL;
        long long iv;
        const char *text;
        Py_ssize_t len;
        int big;
        json_ws(r);
        if ((got = json_str(r, &k)) != 1)
            break;
        json_ws(r);
        if (r->p >= r->end || *r->p != ':') {
            Py_DECREF(k);
            got = 0;
            break;
        }
        r->p++;
        json_ws(r);
        if (r->p < r->end && *r->p == '"') {
            got = json_str(r, &v);
        } else if (json_word(r, "true", 4)) {
            v = Py_NewRef(S_true);
            got = 1;
        } else if (json_word(r, "false", 5)) {
            v = Py_NewRef(S_false);
            got = 1;
        } else if (json_word(r, "null", 4)) {
            v = Py_NewRef(Py_None);
            nulls = 1;
            got = 1;
        } else if ((got = json_int(r, &iv, &big, &text, &len)) == 1) {
            if (big)
                got = 0;   /* str() of a long int: the fallback's (Python's digit limit) */
            else if (len == 2 && text[0] == '-' && text[1] == '0')
                v = Py_NewRef(S_zero);
            else if ((v = PyUnicode_FromStringAndSize(text, len)) == NULL)
                got = -1;
        }
        if (got == 1 && PyDict_SetItem(d, k, v) < 0)
            got = -1;
        Py_DECREF(k);
        Py_XDECREF(v);
        if (got != 1)
            break;
        json_ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        if (r->p < r->end && *r->p == '}') {
            r->p++;
            break;
        }
        got = 0;
        break;
    }
    if (got != 1) {
        Py_DECREF(d);
        return got;
    }
    if (nulls) {
        PyObject *kept = PyDict_New(), *k, *v;
        Py_ssize_t pos = 0;
        if (kept == NULL) {
            Py_DECREF(d);
            return -1;
        }
        while (PyDict_Next(d, &pos, &k, &v)) {
            if (v != Py_None && PyDict_SetItem(kept, k, v) < 0) {
                Py_DECREF(kept);
                Py_DECREF(d);
                return -1;
            }
        }
        Py_DECREF(d);
        d = kept;
    }
    *out = d;
    return 1;
}

enum { K_OTHER, K_CODE, K_LANGUAGE, K_VERSION, K_OPAQUE, K_FLAG, K_REMARK, K_EXT };

static int json_key_kind(PyObject *key) {
    static const char *names[] = {NULL, "code", "language", "version", "opaque", "flag", "remark", "extFields"};
    for (int i = 1; i <= K_EXT; i++)
        if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0)
            return i;
    return K_OTHER;
}

/* The header object (headers.decode_json_header): repeated keys, the last wins. */
static int json_fields(const unsigned char *p, Py_ssize_t n, Fields *f) {
    Reader r = {p, p + n};
    int have_code = 0, got;
    f->version = f->opaque = f->flag = 0;
    f->remark = Py_NewRef(Py_None);
    f->ext = Py_NewRef(Py_None);
    json_ws(&r);
    if (r.p >= r.end || *r.p != '{')
        return 0;
    r.p++;
    json_ws(&r);
    if (r.p < r.end && *r.p == '}')
        return 0;   /* no code */
    for (;;) {
        PyObject *key, *value = NULL;
        json_ws(&r);
        if ((got = json_str(&r, &key)) != 1)
            return got;
        int kind = json_key_kind(key);
        Py_DECREF(key);
        json_ws(&r);
        if (r.p >= r.end || *r.p != ':')
            return 0;
        r.p++;
        json_ws(&r);
        switch (kind) {
        case K_CODE: case K_VERSION: case K_OPAQUE: case K_FLAG:
            if (!json_int_field(&r, kind == K_CODE ? &f->code : kind == K_VERSION ? &f->version
                                    : kind == K_OPAQUE ? &f->opaque : &f->flag))
                return 0;
            have_code |= kind == K_CODE;
            break;
        case K_LANGUAGE:
            if (r.p < r.end && *r.p == '"') {
                PyObject *name;
                if ((got = json_str(&r, &name)) != 1)
                    return got;
                value = language_named(name);
                Py_DECREF(name);
            } else {
                long long v;
                const char *text;
                Py_ssize_t len;
                int big;
                if (json_int(&r, &v, &big, &text, &len) != 1 || big)
                    return 0;
                value = PyLong_FromLongLong(v);
            }
            if (value == NULL)
                return -1;
            Py_XSETREF(f->language, value);
            break;
        case K_REMARK:
            if (json_word(&r, "null", 4))
                value = Py_NewRef(Py_None);
            else if ((got = json_str(&r, &value)) != 1)
                return got;
            Py_SETREF(f->remark, value);
            break;
        case K_EXT:
            if ((got = json_ext(&r, &value)) != 1)
                return got;
            Py_SETREF(f->ext, value);
            break;
        default:
            if ((got = json_skip(&r)) != 1)
                return got;
        }
        json_ws(&r);
        if (r.p < r.end && *r.p == ',') {
            r.p++;
            continue;
        }
        if (r.p < r.end && *r.p == '}') {
            r.p++;
            break;
        }
        return 0;
    }
    json_ws(&r);
    if (r.p != r.end || !have_code)
        return 0;
    if (f->language == NULL)
        f->language = Py_NewRef(JavaLanguage);
    return 1;
}

/* ---- frames ---------------------------------------------------------------------------------- */

static PyObject *make_command(Fields *f, PyObject *stype, PyObject *body) {
    PyObject *values[N_FIELDS] = {PyLong_FromLongLong(f->code), f->language, PyLong_FromLongLong(f->version),
                                  PyLong_FromLongLong(f->opaque), PyLong_FromLongLong(f->flag), f->remark, f->ext,
                                  body, stype};
    PyTypeObject *type = (PyTypeObject *)Command;
    PyObject *cmd = NULL;
    if (values[F_CODE] && values[F_VERSION] && values[F_OPAQUE] && values[F_FLAG] &&
        (cmd = type->tp_alloc(type, 0)) != NULL) {
        for (int i = 0; i < N_FIELDS; i++) {
            if (Py_TYPE(Slot[i])->tp_descr_set(Slot[i], cmd, values[i]) < 0) {
                Py_CLEAR(cmd);
                break;
            }
        }
    }
    Py_XDECREF(values[F_CODE]);
    Py_XDECREF(values[F_VERSION]);
    Py_XDECREF(values[F_OPAQUE]);
    Py_XDECREF(values[F_FLAG]);
    return cmd;
}

/* The Python decoder of this serialize type decides (and raises its HeaderError). */
static PyObject *fallback(PyObject *decode, const unsigned char *header, Py_ssize_t n, PyObject *body) {
    PyObject *raw = PyBytes_FromStringAndSize((const char *)header, n), *cmd;
    if (raw == NULL)
        return NULL;
    cmd = PyObject_CallOneArg(decode, raw);
    Py_DECREF(raw);
    if (cmd != NULL && PyObject_SetAttr(cmd, S_body, body) < 0)
        Py_CLEAR(cmd);
    return cmd;
}

static PyObject *frame_error_length(unsigned long length, Py_ssize_t max_frame) {
    if ((long long)length > (long long)max_frame)
        return PyErr_Format(FrameErrorT, "frame length %lu exceeds the limit of %zd bytes", length, max_frame);
    return PyErr_Format(FrameErrorT, "frame length %lu is shorter than the header-length field", length);
}

/* split(buf, max_frame) -> (commands, consumed): FrameDecoder.feed's loop over one buffer. */
static PyObject *split(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer view;
    Py_ssize_t max_frame, pos = 0;
    PyObject *out, *result = NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "split(buf, max_frame)");
        return NULL;
    }
    if (Command == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "smartgo.net._codec is not configured");
        return NULL;
    }
    max_frame = PyLong_AsSsize_t(args[1]);
    if (max_frame == -1 && PyErr_Occurred())
        return NULL;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if ((out = PyList_New(0)) == NULL)
        goto done;
    const unsigned char *buf = view.buf;
    Py_ssize_t size = view.len;
    while (size - pos >= 4) {
        unsigned long length = be32(buf + pos);
        if (size - pos < 8) {
            if ((long long)length > (long long)max_frame || length < 4)
                goto fail_length;
            break;
        }
        if ((long long)length > (long long)max_frame || length < 4)
            goto fail_length;
        uint32_t mark = be32(buf + pos + 4);
        unsigned stype = mark >> 24;
        Py_ssize_t header_len = mark & 0xFFFFFF;
        PyObject *decode = DecoderOf[stype];
        if (decode == NULL) {
            PyErr_Format(FrameErrorT, "unknown serialize type %u", stype);
            goto fail;
        }
        if ((long long)header_len > (long long)length - 4) {
            PyErr_Format(FrameErrorT, "header length %zd does not fit in frame length %lu", header_len, length);
            goto fail;
        }
        Py_ssize_t end = pos + 4 + (Py_ssize_t)length;
        if (end > size)
            break;
        const unsigned char *header = buf + pos + 8;
        Py_ssize_t body_start = pos + 8 + header_len;
        PyObject *body, *cmd = NULL;
        if (end > body_start)
            body = PyBytes_FromStringAndSize((const char *)buf + body_start, end - body_start);
        else
            body = Py_NewRef(Py_None);
        if (body == NULL)
            goto fail;
        Fields f = {0};
        int got = 0;
        if (stype == MSGPACK)
            got = msgpack_fields(header, header_len, &f);
        else if (stype == JSON)
            got = json_fields(header, header_len, &f);
        if (got == 1 && !(int32_ok(f.code) && int32_ok(f.version) && int32_ok(f.opaque) && int32_ok(f.flag)))
            got = 0;
        long long flag = f.flag;
        if (got == 1)
            cmd = make_command(&f, stype == MSGPACK ? TypeMsgpack : TypeJson, body);
        else if (got == 0)
            cmd = fallback(decode, header, header_len, body);
        fields_clear(&f);
        Py_DECREF(body);
        if (cmd == NULL)
            goto fail;
        if (got != 1) {
            PyObject *fl = PyObject_GetAttr(cmd, S_flag);
            flag = fl ? PyLong_AsLongLong(fl) : -1;
            Py_XDECREF(fl);
            if (flag == -1 && PyErr_Occurred()) {
                Py_DECREF(cmd);
                goto fail;
            }
        }
        if ((flag & CompressedMask) == CompressedMask) {
            PyObject *mf = PyLong_FromSsize_t(max_frame), *r = NULL;
            if (mf != NULL)
                r = PyObject_CallFunctionObjArgs(Inflate, cmd, mf, NULL);
            Py_XDECREF(mf);
            if (r == NULL) {
                Py_DECREF(cmd);
                goto fail;
            }
            Py_DECREF(r);
        }
        int appended = PyList_Append(out, cmd);
        Py_DECREF(cmd);
        if (appended < 0)
            goto fail;
        pos = end;
    }
    result = Py_BuildValue("(Nn)", out, pos);
    goto done;
fail_length:
    frame_error_length(be32(buf + pos), max_frame);
fail:
    Py_DECREF(out);
done:
    PyBuffer_Release(&view);
    return result;
}

/* ---- outgoing headers ------------------------------------------------------------------------ */

typedef struct {
    char *p;
    Py_ssize_t len, cap;
    char stack[1024];
} Out;

static int out_reserve(Out *o, Py_ssize_t extra) {
    if (o->len + extra <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap * 2;
    while (cap < o->len + extra)
        cap *= 2;
    char *p = o->p == o->stack ? PyMem_Malloc(cap) : PyMem_Realloc(o->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (o->p == o->stack)
        memcpy(p, o->stack, o->len);
    o->p = p;
    o->cap = cap;
    return 0;
}

static int out_put(Out *o, const void *s, Py_ssize_t n) {
    if (out_reserve(o, n) < 0)
        return -1;
    memcpy(o->p + o->len, s, n);
    o->len += n;
    return 0;
}

static void out_free(Out *o) {
    if (o->p != o->stack)
        PyMem_Free(o->p);
}

/* An int field as a C long long: 1, or 0 when it is not a plain int that fits (the fallback's). */
static int int_field(PyObject *v, long long *out) {
    int overflow;
    if (!PyLong_Check(v) || PyBool_Check(v))
        return 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* msgpack's smallest form for an integer, as msgpack.Packer writes it */
static int mp_w_int(Out *o, long long d) {
    unsigned char b[9];
    Py_ssize_t n;
    if (d < -(1LL << 5)) {
        if (d < -(1LL << 15)) {
            if (d < -(1LL << 31)) {
                b[0] = 0xd3;
                for (int i = 0; i < 8; i++) b[1 + i] = (unsigned char)((uint64_t)d >> (56 - 8 * i));
                n = 9;
            } else {
                b[0] = 0xd2;
                for (int i = 0; i < 4; i++) b[1 + i] = (unsigned char)((uint32_t)d >> (24 - 8 * i));
                n = 5;
            }
        } else if (d < -(1 << 7)) {
            b[0] = 0xd1; b[1] = (unsigned char)((uint16_t)d >> 8); b[2] = (unsigned char)d;
            n = 3;
        } else {
            b[0] = 0xd0; b[1] = (unsigned char)d;
            n = 2;
        }
    } else if (d < (1 << 7)) {
        b[0] = (unsigned char)d;
        n = 1;
    } else if (d < (1LL << 8)) {
        b[0] = 0xcc; b[1] = (unsigned char)d;
        n = 2;
    } else if (d < (1LL << 16)) {
        b[0] = 0xcd; b[1] = (unsigned char)(d >> 8); b[2] = (unsigned char)d;
        n = 3;
    } else if (d < (1LL << 32)) {
        b[0] = 0xce;
        for (int i = 0; i < 4; i++) b[1 + i] = (unsigned char)(d >> (24 - 8 * i));
        n = 5;
    } else {
        b[0] = 0xcf;
        for (int i = 0; i < 8; i++) b[1 + i] = (unsigned char)((uint64_t)d >> (56 - 8 * i));
        n = 9;
    }
    return out_put(o, b, n);
}

static int mp_w_len(Out *o, Py_ssize_t n, unsigned char fix, Py_ssize_t fix_max, unsigned char t8,
                    unsigned char t16, unsigned char t32) {
    unsigned char b[5];
    if (n <= fix_max) {
        b[0] = (unsigned char)(fix | n);
        return out_put(o, b, 1);
    }
    if (t8 && n < 256) {
        b[0] = t8; b[1] = (unsigned char)n;
        return out_put(o, b, 2);
    }
    if (n < 65536) {
        b[0] = t16; b[1] = (unsigned char)(n >> 8); b[2] = (unsigned char)n;
        return out_put(o, b, 3);
    }
    b[0] = t32;
    for (int i = 0; i < 4; i++) b[1 + i] = (unsigned char)((uint64_t)n >> (24 - 8 * i));
    return out_put(o, b, 5);
}

/* 1 written, 0 not a str that encodes (the fallback's), -1 error */
static int mp_w_str(Out *o, PyObject *s) {
    Py_ssize_t n;
    const char *u;
    if (!PyUnicode_Check(s))
        return 0;
    if ((u = PyUnicode_AsUTF8AndSize(s, &n)) == NULL) {
        PyErr_Clear();
        return 0;
    }
    if ((uint64_t)n > 0xFFFFFFFFULL)
        return 0;
    if (mp_w_len(o, n, 0xa0, 31, 0xd9, 0xda, 0xdb) < 0 || out_put(o, u, n) < 0)
        return -1;
    return 1;
}

static int msgpack_header(Out *o, long long code, long long language, long long version, long long opaque,
                          long long flag, PyObject *remark, PyObject *ext) {
    unsigned char array7 = 0x97, nil = 0xc0;
    int got;
    if (out_put(o, &array7, 1) < 0 || mp_w_int(o, code) < 0 || mp_w_int(o, language) < 0 ||
        mp_w_int(o, version) < 0 || mp_w_int(o, opaque) < 0 || mp_w_int(o, flag) < 0)
        return -1;
    if (remark == Py_None) {
        if (out_put(o, &nil, 1) < 0)
            return -1;
    } else if ((got = mp_w_str(o, remark)) != 1) {
        return got;
    }
    if (ext == Py_None)
        return out_put(o, &nil, 1) < 0 ? -1 : 1;
    if (!PyDict_CheckExact(ext) || PyDict_GET_SIZE(ext) > 0xFFFFFFFFLL)
        return 0;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    if (mp_w_len(o, PyDict_GET_SIZE(ext), 0x80, 15, 0, 0xde, 0xdf) < 0)
        return -1;
    while (PyDict_Next(ext, &pos, &k, &v)) {
        if ((got = mp_w_str(o, k)) != 1 || (got = mp_w_str(o, v)) != 1)
            return got;
    }
    return 1;
}

/* json.encoder.encode_basestring_ascii */
static int json_w_quoted(Out *o, PyObject *s) {
    static const char hex[] = "0123456789abcdef";
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(s) < 0)
        return -1;
#endif
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    if (n > (PY_SSIZE_T_MAX - 2) / 12 || out_reserve(o, 2 + 12 * n) < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    char *w = o->p + o->len;
    *w++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= ' ' && c <= '~' && c != '\\' && c != '"') {
            *w++ = (char)c;
            continue;
        }
        *w++ = '\\';
        switch (c) {
        case '\\': case '"': *w++ = (char)c; break;
        case '\b': *w++ = 'b'; break;
        case '\f': *w++ = 'f'; break;
        case '\n': *w++ = 'n'; break;
        case '\r': *w++ = 'r'; break;
        case '\t': *w++ = 't'; break;
        default:
            if (c >= 0x10000) {
                Py_UCS4 hi = 0xd800 | ((c - 0x10000) >> 10);
                *w++ = 'u';
                for (int k = 12; k >= 0; k -= 4) *w++ = hex[(hi >> k) & 0xf];
                *w++ = '\\';
                c = 0xdc00 | ((c - 0x10000) & 0x3ff);
            }
            *w++ = 'u';
            for (int k = 12; k >= 0; k -= 4) *w++ = hex[(c >> k) & 0xf];
        }
    }
    *w++ = '"';
    o->len = w - o->p;
    return 0;
}

static int json_w_int(Out *o, const char *before, long long v) {
    char num[32];
    int n = snprintf(num, sizeof num, "%lld", v);
    return out_put(o, before, strlen(before)) < 0 || out_put(o, num, n) < 0 ? -1 : 0;
}

/* headers.encode_json_header: fastjson's compact output, fields in alphabetical order */
static int json_header(Out *o, long long code, PyObject *language, long long version, long long opaque,
                       long long flag, PyObject *remark, PyObject *ext) {
    PyObject *name = PyDict_GetItemWithError(LanguageNames, language);
    const char *lang = "OTHER";
    Py_ssize_t lang_len = 5;
    if (name == NULL && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (name != NULL && (!PyUnicode_Check(name) || (lang = PyUnicode_AsUTF8AndSize(name, &lang_len)) == NULL)) {
        PyErr_Clear();
        return 0;
    }
    if (remark != Py_None && !PyUnicode_Check(remark))
        return 0;
    if (ext != Py_None) {
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        if (!PyDict_CheckExact(ext))
            return 0;
        while (PyDict_Next(ext, &pos, &k, &v))
            if (!PyUnicode_Check(k) || !PyUnicode_Check(v))
                return 0;   /* headers._json_ext writes those as Java's toString() would */
    }
    if (json_w_int(o, "{\"code\":", code) < 0)
        return -1;
    if (ext != Py_None) {
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        int first = 1;
        if (out_put(o, ",\"extFields\":{", 14) < 0)
            return -1;
        while (PyDict_Next(ext, &pos, &k, &v)) {
            if ((!first && out_put(o, ",", 1) < 0) || json_w_quoted(o, k) < 0 || out_put(o, ":", 1) < 0 ||
                json_w_quoted(o, v) < 0)
                return -1;
            first = 0;
        }
        if (out_put(o, "}", 1) < 0)
            return -1;
    }
    if (json_w_int(o, ",\"flag\":", flag) < 0 || out_put(o, ",\"language\":\"", 13) < 0 ||
        out_put(o, lang, lang_len) < 0 || json_w_int(o, "\",\"opaque\":", opaque) < 0)
        return -1;
    if (remark != Py_None && (out_put(o, ",\"remark\":", 10) < 0 || json_w_quoted(o, remark) < 0))
        return -1;
    if (json_w_int(o, ",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":", version) < 0 || out_put(o, "}", 1) < 0)
        return -1;
    return 1;
}

/* head(cmd, extra_flags, body_len) -> the frame's length prefix and header as one bytes, or None
 * where frame.encode_command's Python path decides (another serialize type, a value that is not
 * a str, an int that does not fit, a frame too long). */
static PyObject *head(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *cmd, *attrs[8] = {NULL}, *result = NULL;
    PyObject *const names[8] = {S_serialize_type, S_code, S_language, S_version, S_opaque, S_flag, S_remark,
                                S_ext_fields};
    long long stype, code, language = 0, version, opaque, flag, extra, body_len;
    Out o;
    int got = 0;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "head(cmd, extra_flags, body_len)");
        return NULL;
    }
    cmd = args[0];
    if (!int_field(args[1], &extra) || !int_field(args[2], &body_len) || body_len < 0)
        Py_RETURN_NONE;
    static const int slots[8] = {F_STYPE, F_CODE, F_LANGUAGE, F_VERSION, F_OPAQUE, F_FLAG, F_REMARK, F_EXT};
    int exact = Py_TYPE(cmd) == (PyTypeObject *)Command;
    for (int i = 0; i < 8; i++) {
        PyObject *d = Slot[slots[i]];
        attrs[i] = exact ? Py_TYPE(d)->tp_descr_get(d, cmd, Command) : PyObject_GetAttr(cmd, names[i]);
        if (attrs[i] == NULL)
            goto done;
    }
    if (!int_field(attrs[0], &stype) || (stype != JSON && stype != MSGPACK) || !int_field(attrs[1], &code) ||
        !int_field(attrs[3], &version) || !int_field(attrs[4], &opaque) || !int_field(attrs[5], &flag) ||
        (stype == MSGPACK && !int_field(attrs[2], &language))) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    flag |= extra;
    o.p = o.stack;
    o.len = 8;
    o.cap = sizeof o.stack;
    if (stype == MSGPACK)
        got = msgpack_header(&o, code, language, version, opaque, flag, attrs[6], attrs[7]);
    else
        got = json_header(&o, code, attrs[2], version, opaque, flag, attrs[6], attrs[7]);
    if (got == 1) {
        uint64_t header_len = (uint64_t)(o.len - 8), total = 4 + header_len + (uint64_t)body_len;
        if (header_len > 0xFFFFFF || total > 0xFFFFFFFFULL) {
            result = Py_NewRef(Py_None);
        } else {
            uint32_t mark = ((uint32_t)stype << 24) | (uint32_t)header_len;
            unsigned char *p = (unsigned char *)o.p;
            for (int i = 0; i < 4; i++) {
                p[i] = (unsigned char)(total >> (24 - 8 * i));
                p[4 + i] = (unsigned char)(mark >> (24 - 8 * i));
            }
            result = PyBytes_FromStringAndSize(o.p, o.len);
        }
    } else if (got == 0) {
        result = Py_NewRef(Py_None);
    }
    out_free(&o);
done:
    for (int i = 0; i < 8; i++)
        Py_XDECREF(attrs[i]);
    return result;
}

/* ---- module ---------------------------------------------------------------------------------- */

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *command, *frame_error, *decoders, *languages, *other, *java, *names, *inflate, *json_type,
        *msgpack_type;
    long mask;
    if (!PyArg_ParseTuple(args, "OOO!O!OOO!OOOl:configure", &command, &frame_error, &PyDict_Type, &decoders,
                          &PyDict_Type, &languages, &other, &java, &PyDict_Type, &names, &inflate, &json_type,
                          &msgpack_type, &mask))
        return NULL;
    for (int i = 0; i < 256; i++)
        Py_CLEAR(DecoderOf[i]);
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(decoders, &pos, &k, &v)) {
        long t = PyLong_AsLong(k);
        if (t == -1 && PyErr_Occurred())
            return NULL;
        if (t < 0 || t > 255) {
            PyErr_SetString(PyExc_ValueError, "a serialize type is one byte");
            return NULL;
        }
        Py_XSETREF(DecoderOf[t], Py_NewRef(v));
    }
    static const char *field_names[N_FIELDS] = {"code", "language", "version", "opaque", "flag", "remark",
                                                "ext_fields", "body", "serialize_type"};
    if (!PyType_Check(command)) {
        PyErr_SetString(PyExc_TypeError, "the command type must be a class");
        return NULL;
    }
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *d = PyDict_GetItemString(((PyTypeObject *)command)->tp_dict, field_names[i]);
        if (d == NULL || Py_TYPE(d)->tp_descr_get == NULL || Py_TYPE(d)->tp_descr_set == NULL) {
            PyErr_Format(PyExc_TypeError, "the command type has no slot %s", field_names[i]);
            return NULL;
        }
        Py_XSETREF(Slot[i], Py_NewRef(d));
    }
    Py_XSETREF(Command, Py_NewRef(command));
    Py_XSETREF(FrameErrorT, Py_NewRef(frame_error));
    Py_XSETREF(Languages, Py_NewRef(languages));
    Py_XSETREF(OtherLanguage, Py_NewRef(other));
    Py_XSETREF(JavaLanguage, Py_NewRef(java));
    Py_XSETREF(LanguageNames, Py_NewRef(names));
    Py_XSETREF(Inflate, Py_NewRef(inflate));
    Py_XSETREF(TypeJson, Py_NewRef(json_type));
    Py_XSETREF(TypeMsgpack, Py_NewRef(msgpack_type));
    CompressedMask = mask;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(command, frame_error, decoders, languages, other_language, java_language, language_names, "
     "inflate, json_type, msgpack_type, compressed_mask): the Python codec's types and fallbacks"},
    {"split", (PyCFunction)(void (*)(void))split, METH_FASTCALL,
     "split(buf, max_frame) -> (commands, consumed): the complete frames at the start of buf"},
    {"head", (PyCFunction)(void (*)(void))head, METH_FASTCALL,
     "head(cmd, extra_flags, body_len) -> length prefix + header bytes, or None for the Python encoder"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_codec", NULL, -1, methods};

PyMODINIT_FUNC PyInit__codec(void) {
    struct { PyObject **slot; const char *text; } strings[] = {
        {&S_code, "code"}, {&S_language, "language"}, {&S_version, "version"}, {&S_opaque, "opaque"},
        {&S_flag, "flag"}, {&S_remark, "remark"}, {&S_ext_fields, "ext_fields"}, {&S_body, "body"},
        {&S_serialize_type, "serialize_type"}, {&S_true, "true"}, {&S_false, "false"}, {&S_zero, "0"},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if ((*strings[i].slot = PyUnicode_InternFromString(strings[i].text)) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
