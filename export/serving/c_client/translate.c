/* Translates stdin with an exported SavedModel through the TensorFlow C API: no Python.
 *
 *   translate --saved_model=EXPORT_DIR/1 --ops_library=.../_sentencepiece_tokenizer.so
 *             [--batch_size=32] [--signature=serving_default] [--input=text]
 *             [--output=translation] [--intra_op_threads=N] [--inter_op_threads=N]
 *             < in.txt > out.txt
 *
 * Loads the tensorflow-text ops (SentencepieceOp, ...) with TF_LoadLibrary, then the
 * version with TF_LoadSessionFromSavedModel and tag "serve" (the loader TF Serving
 * uses), reads the signature's tensor names from the MetaGraphDef's signature_def and
 * runs it on batches of lines: one output line per input line, in order (newlines in
 * a translation become spaces; a trailing "\r" of an input line is dropped).
 * stderr ends with one timing line: sentences/s of the session runs alone.
 * --intra_op_threads / --inter_op_threads set the session's thread pools (a ConfigProto
 * through TF_SetConfig), as TF Serving's --tensorflow_intra_op_parallelism and
 * --tensorflow_inter_op_parallelism do; 0 (the default) leaves TensorFlow's choice.
 */
#define _POSIX_C_SOURCE 200809L  /* getline, clock_gettime */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tensorflow/c/c_api.h"

static void die(const char *what, const TF_Status *status) {
  fprintf(stderr, "translate: %s: %s\n", what, status ? TF_Message(status) : "");
  exit(1);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* --- just enough protobuf wire format to read MetaGraphDef.signature_def ---------- */
typedef struct { const uint8_t *p, *end; } Span;

static uint64_t varint(Span *s) {
  uint64_t v = 0;
  for (int shift = 0; s->p < s->end && shift < 64; shift += 7) {
    uint8_t b = *s->p++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  return v;
}

/* The next field of message `s`: its number, and its bytes if length-delimited. */
static int next_field(Span *s, int *number, Span *bytes) {
  if (s->p >= s->end) return 0;
  uint64_t key = varint(s);
  *number = (int)(key >> 3);
  bytes->p = bytes->end = NULL;
  switch (key & 7) {
    case 0: varint(s); break;
    case 1: s->p += 8; break;
    case 5: s->p += 4; break;
    case 2: {
      uint64_t n = varint(s);
      if (n > (uint64_t)(s->end - s->p)) return 0;
      bytes->p = s->p, bytes->end = s->p + n, s->p += n;
      break;
    }
    default: return 0; /* groups: not in these messages */
  }
  return s->p <= s->end;
}

static int span_is(Span s, const char *text) {
  return (size_t)(s.end - s.p) == strlen(text) && !memcmp(s.p, text, s.end - s.p);
}

/* Value (field 2) of the map<string, ...> entry (field `field` of `msg`) keyed `key`. */
static int map_value(Span msg, int field, const char *key, Span *value) {
  int number, inner;
  Span entry, part, k = {0}, v = {0};
  while (next_field(&msg, &number, &entry)) {
    if (number != field || !entry.p) continue;
    k.p = k.end = v.p = v.end = NULL;
    while (next_field(&entry, &inner, &part))
      if (inner == 1) k = part; else if (inner == 2) v = part;
    if (k.p && span_is(k, key)) { *value = v; return 1; }
  }
  return 0;
}

/* "op:index" of TensorInfo.name (field 1) as a graph output. */
static TF_Output tensor_of(TF_Graph *graph, Span signature, int field, const char *key) {
  Span info, name = {0}, part;
  int number;
  char text[512];
  if (!map_value(signature, field, key, &info)) {
    fprintf(stderr, "translate: the signature has no %s '%s'\n", field == 1 ? "input" : "output", key);
    exit(1);
  }
  while (next_field(&info, &number, &part)) if (number == 1) name = part;
  snprintf(text, sizeof text, "%.*s", (int)(name.end - name.p), (const char *)name.p);
  char *colon = strrchr(text, ':');
  int index = colon ? atoi(colon + 1) : 0;
  if (colon) *colon = '\0';
  TF_Output out = {TF_GraphOperationByName(graph, text), index};
  if (!out.oper) { fprintf(stderr, "translate: no operation %s in the graph\n", text); exit(1); }
  return out;
}

/* --- translation ------------------------------------------------------------------ */
static TF_Tensor *string_tensor(char **lines, const size_t *lengths, int n) {
  int64_t dims[1] = {n};
  TF_Tensor *t = TF_AllocateTensor(TF_STRING, dims, 1, n * sizeof(TF_TString));
  TF_TString *data = (TF_TString *)TF_TensorData(t);
  for (int i = 0; i < n; i++) {
    TF_TString_Init(&data[i]);
    TF_TString_Copy(&data[i], lines[i], lengths[i]);  /* bytes as read, NULs included */
  }
  return t;
}

static double run_batch(TF_Session *session, TF_Output in, TF_Output out, char **lines,
                        const size_t *lengths, int n, TF_Status *status) {
  TF_Tensor *input = string_tensor(lines, lengths, n), *output = NULL;
  double start = now();
  TF_SessionRun(session, NULL, &in, &input, 1, &out, &output, 1, NULL, 0, NULL, status);
  double seconds = now() - start;
  if (TF_GetCode(status) != TF_OK) die("run", status);
  if (TF_TensorType(output) != TF_STRING || TF_NumDims(output) != 1) {
    fprintf(stderr, "translate: the output is not a string tensor of one dimension\n");
    exit(1);
  }
  const TF_TString *texts = (const TF_TString *)TF_TensorData(output);
  for (int i = 0; i < n; i++) {
    size_t size = TF_TString_GetSize(&texts[i]);
    const char *text = TF_TString_GetDataPointer(&texts[i]);
    for (size_t j = 0; j < size; j++) putchar(text[j] == '\n' ? ' ' : text[j]);
    putchar('\n');
  }
  TF_DeleteTensor(input);
  TF_DeleteTensor(output);
  return seconds;
}

static const char *flag(int argc, char **argv, const char *name, const char *fallback) {
  size_t n = strlen(name);
  for (int i = 1; i < argc; i++)
    if (!strncmp(argv[i], name, n) && argv[i][n] == '=') return argv[i] + n + 1;
  return fallback;
}

/* ConfigProto with intra_op_parallelism_threads (field 2) and inter_op_parallelism_threads
 * (field 5), each a varint written only when positive. */
static size_t thread_config(int intra, int inter, uint8_t *proto) {
  size_t n = 0;
  int fields[2][2] = {{2, intra}, {5, inter}};
  for (int f = 0; f < 2; f++) {
    if (fields[f][1] <= 0) continue;
    proto[n++] = (uint8_t)(fields[f][0] << 3);
    for (uint32_t v = (uint32_t)fields[f][1]; ; v >>= 7) {
      proto[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
      if (v <= 0x7f) break;
    }
  }
  return n;
}

int main(int argc, char **argv) {
  const char *export_dir = flag(argc, argv, "--saved_model", NULL);
  const char *signature_name = flag(argc, argv, "--signature", "serving_default");
  int batch_size = atoi(flag(argc, argv, "--batch_size", "32"));
  if (!export_dir || batch_size < 1) {
    fprintf(stderr, "usage: %s --saved_model=DIR --ops_library=SO... [--batch_size=32]\n", argv[0]);
    return 2;
  }
  TF_Status *status = TF_NewStatus();
  for (int i = 1; i < argc; i++)  /* every --ops_library=, in order */
    if (!strncmp(argv[i], "--ops_library=", 14)) {
      TF_LoadLibrary(argv[i] + 14, status);  /* the handle stays loaded for the process */
      if (TF_GetCode(status) != TF_OK) die(argv[i] + 14, status);
    }

  double start = now();
  TF_Graph *graph = TF_NewGraph();
  TF_SessionOptions *options = TF_NewSessionOptions();
  uint8_t config[16];
  size_t config_length = thread_config(atoi(flag(argc, argv, "--intra_op_threads", "0")),
                                       atoi(flag(argc, argv, "--inter_op_threads", "0")), config);
  TF_SetConfig(options, config, config_length, status);
  if (TF_GetCode(status) != TF_OK) die("session config", status);
  TF_Buffer *meta_graph = TF_NewBuffer();
  const char *tags[] = {"serve"};
  TF_Session *session = TF_LoadSessionFromSavedModel(options, NULL, export_dir, tags, 1, graph,
                                                     meta_graph, status);
  if (TF_GetCode(status) != TF_OK) die("load", status);
  double load_seconds = now() - start;
  Span meta = {meta_graph->data, (const uint8_t *)meta_graph->data + meta_graph->length}, sig;
  if (!map_value(meta, 5, signature_name, &sig)) {  /* MetaGraphDef.signature_def */
    fprintf(stderr, "translate: no signature %s\n", signature_name);
    return 1;
  }
  TF_Output in = tensor_of(graph, sig, 1, flag(argc, argv, "--input", "text"));
  TF_Output out = tensor_of(graph, sig, 2, flag(argc, argv, "--output", "translation"));

  char **batch = calloc(batch_size, sizeof(char *));
  size_t *lengths = calloc(batch_size, sizeof(size_t));
  char *line = NULL;
  size_t capacity = 0;
  ssize_t length;
  int n = 0, batches = 0;
  long sentences = 0;
  double seconds = 0, first = 0;
  for (;;) {
    length = getline(&line, &capacity, stdin);
    if (length >= 0) {
      if (length && line[length - 1] == '\n') line[--length] = '\0';
      if (length && line[length - 1] == '\r') line[--length] = '\0';
      batch[n] = malloc(length + 1);
      memcpy(batch[n], line, length + 1);
      lengths[n++] = length;
    }
    if (n == batch_size || (length < 0 && n)) {
      double s = run_batch(session, in, out, batch, lengths, n, status);
      if (!batches++) first = s;
      seconds += s, sentences += n;
      fflush(stdout);
      while (n) free(batch[--n]);
    }
    if (length < 0) break;
  }
  fprintf(stderr, "c_client load_seconds=%.2f batches=%d batch_size=%d sentences=%ld "
          "seconds=%.3f first_batch_seconds=%.3f sentences_per_sec=%.2f\n", load_seconds, batches,
          batch_size, sentences, seconds, first, sentences ? sentences / seconds : 0.0);

  free(line);
  free(batch);
  free(lengths);
  TF_CloseSession(session, status);
  TF_DeleteSession(session, status);
  TF_DeleteBuffer(meta_graph);
  TF_DeleteSessionOptions(options);
  TF_DeleteGraph(graph);
  TF_DeleteStatus(status);
  return 0;
}
