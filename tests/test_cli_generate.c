/* The text commands end to end: lmx run (streaming and --json), lmx
 * template against transformers' rendering, and lmx chat driven through a
 * pipe, Ctrl-C included; and lmx bench's report and its device choice. */
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define QWEN LMX_TEST_DATA "/qwen3-tiny"
#define GEMMA LMX_TEST_DATA "/gemma3-tiny"

static void check_run(void)
{
    char *out = NULL, cmd[2048];
    /* the fixture's p0 ("Hello, world!") and its first greedy tokens */
    snprintf(cmd, sizeof cmd, "%s run %s --prompt-ids 9707,11,1879,0 -n 5 --temp 0 --ignore-eos --json", LMX_BIN, QWEN);
    CHECK(test_run(cmd, &out) == 0, "%s", cmd);
    cJSON *j = out ? cJSON_Parse(out) : NULL;
    CHECK(j != NULL, "--json prints one JSON object: %s", out ? out : "");
    cJSON *ids = cJSON_GetObjectItem(j, "ids"), *stats = cJSON_GetObjectItem(j, "stats");
    CHECK(cJSON_GetArraySize(ids) == 5, "5 ids");
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(j, "stop_reason")), "max_tokens"), "stop_reason");
    CHECK(cJSON_IsString(cJSON_GetObjectItem(j, "text")), "text");
    CHECK(cJSON_GetObjectItem(stats, "prompt_tokens")->valueint == 4 &&
              cJSON_GetObjectItem(stats, "generated_tokens")->valueint == 5 &&
              cJSON_GetObjectItem(stats, "decode_tok_s")->valuedouble > 0,
          "stats");
    /* streaming prints the same text */
    char *text = strdup(cJSON_GetStringValue(cJSON_GetObjectItem(j, "text")));
    cJSON_Delete(j);
    free(out);
    snprintf(cmd, sizeof cmd, "%s run %s --prompt-ids 9707,11,1879,0 -n 5 --temp 0 --ignore-eos", LMX_BIN, QWEN);
    CHECK(test_run(cmd, &out) == 0 && out && !strncmp(out, text, strlen(text)) && out[strlen(text)] == '\n',
          "streamed '%s' vs json '%s'", out, text);
    free(out);
    /* weights read in place from the file: the same greedy text */
    snprintf(cmd, sizeof cmd, "%s run %s --prompt-ids 9707,11,1879,0 -n 5 --temp 0 --ignore-eos --mmap", LMX_BIN,
             QWEN);
    CHECK(test_run(cmd, &out) == 0 && out && !strncmp(out, text, strlen(text)) && out[strlen(text)] == '\n',
          "--mmap '%s' vs '%s'", out, text);
    free(out);
    free(text);
    /* a text prompt through the chat format, with --verbose stats on stderr */
    snprintf(cmd, sizeof cmd, "%s run %s --chat -p 'Hi there' -n 3 --seed 1 --verbose 2>&1 >/dev/null", LMX_BIN, GEMMA);
    CHECK(test_run(cmd, &out) == 0 && out && strstr(out, "prompt 11 tokens") && strstr(out, "decode"),
          "verbose stats: %s", out ? out : "");
    free(out);
    /* bad arguments: clear message, non-zero exit */
    snprintf(cmd, sizeof cmd, "%s run %s -p hi --top-p 1.5 2>&1", LMX_BIN, QWEN);
    CHECK(test_run(cmd, &out) == 2 && out && strstr(out, "--top-p"), "bad --top-p: %s", out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s run %s -p hi --quant q5 2>&1", LMX_BIN, QWEN);
    CHECK(test_run(cmd, &out) == 2 && out && strstr(out, "--quant 'q5'"), "bad --quant: %s", out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s run %s -p hi --kv bogus 2>&1", LMX_BIN, QWEN);
    CHECK(test_run(cmd, &out) == 2 && out && strstr(out, "--kv 'bogus': want f32 or f16"), "bad --kv: %s",
          out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s run %s --prompt-ids 9707,11 -n 3 --temp 0 --ignore-eos --kv f16 --json", LMX_BIN,
             QWEN);
    CHECK(test_run(cmd, &out) == 0 && out && strstr(out, "\"generated_tokens\":3"), "--kv f16: %s", out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s run %s --prompt-ids 9707,11 -n 3 --temp 0 --ignore-eos --quant q8 --json", LMX_BIN,
             QWEN);
    CHECK(test_run(cmd, &out) == 0 && out && strstr(out, "\"generated_tokens\":3"), "--quant q8: %s", out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s run %s --prompt-ids 1,2 --ctx 1 2>&1", LMX_BIN, QWEN);
    CHECK(test_run(cmd, &out) == 1 && out && strstr(out, "does not fit"), "prompt beyond the context: %s", out ? out : "");
    free(out);
    /* no tokenizer.json: said before the weights load (here there are none,
     * so a weights error would show that the check came too late) */
    char bare[600];
    snprintf(bare, sizeof bare, "%s/no-tokenizer", test_tmpdir());
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/", bare, QWEN, bare);
    CHECK(test_run(cmd, NULL) == 0, "%s", cmd);
    const char *verbs[] = {"run %s -p hi", "run %s --prompt-ids 1,2", "chat %s"};
    for (int v = 0; v < 3; v++) {
        char what[700];
        snprintf(what, sizeof what, verbs[v], bare);
        snprintf(cmd, sizeof cmd, "%s %s 2>&1 </dev/null", LMX_BIN, what);
        CHECK(test_run(cmd, &out) == 1 && out && strstr(out, "no-tokenizer/tokenizer.json: not found"),
              "%s: %s", what, out ? out : "");
        free(out);
    }
}

static void check_template(void)
{
    char path[600], cmd[2048], *out = NULL;
    snprintf(path, sizeof path, "%s/msgs.json", test_tmpdir());
    FILE *f = fopen(path, "w");
    fputs("[{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"},"
          " {\"role\": \"user\", \"content\": \"What is 2+2?\"}]", f);
    fclose(f);
    /* rows of tokenizer_refs.json rendered by transformers */
    snprintf(cmd, sizeof cmd, "%s template %s --messages %s --no-thinking", LMX_BIN, QWEN, path);
    CHECK(test_run(cmd, &out) == 0 && out &&
              !strcmp(out, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                           "What is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
          "qwen3 template: '%s'", out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s template %s --messages %s --no-generation-prompt", LMX_BIN, QWEN, path);
    CHECK(test_run(cmd, &out) == 0 && out &&
              !strcmp(out, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                           "What is 2+2?<|im_end|>\n"),
          "qwen3 template without generation prompt: '%s'", out ? out : "");
    free(out);
    f = fopen(path, "w");
    fputs("[{\"role\": \"user\", \"content\": \"Hello!\"}]", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s template %s --messages %s", LMX_BIN, GEMMA, path);
    CHECK(test_run(cmd, &out) == 0 && out &&
              !strcmp(out, "<bos><start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n"),
          "gemma3 template: '%s'", out ? out : "");
    free(out);
    f = fopen(path, "w");
    fputs("[{\"role\": \"oracle\", \"content\": \"x\"}]", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s template %s --messages %s 2>&1", LMX_BIN, GEMMA, path);
    CHECK(test_run(cmd, &out) == 1 && out && strstr(out, "oracle"), "unknown role: '%s'", out ? out : "");
    free(out);
}

/* Runs lmx chat with stdin, stdout and stderr on pipes. */
typedef struct child {
    pid_t pid;
    int in, out, err;
} child;

static child spawn_chat(const char *extra)
{
    int pin[2], pout[2], perr[2];
    child c = {-1, -1, -1, -1};
    if (pipe(pin) || pipe(pout) || pipe(perr))
        return c;
    c.pid = fork();
    if (c.pid == 0) {
        dup2(pin[0], 0);
        dup2(pout[1], 1);
        dup2(perr[1], 2);
        close(pin[1]);
        close(pout[0]);
        close(perr[0]);
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "exec %s chat %s %s", LMX_BIN, GEMMA, extra);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(pin[0]);
    close(pout[1]);
    close(perr[1]);
    c.in = pin[1];
    c.out = pout[0];
    c.err = perr[0];
    return c;
}

static size_t drain(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    ssize_t got;
    char sink[4096];
    while ((got = read(fd, len + 1 < cap ? buf + len : sink, len + 1 < cap ? cap - len - 1 : sizeof sink)) > 0)
        if (len + 1 < cap)
            len += (size_t)got;
    buf[len] = 0;
    return len;
}

static int finish_chat(child c, char *errbuf, size_t cap)
{
    static char outbuf[1 << 16];
    close(c.in);
    drain(c.out, outbuf, sizeof outbuf);
    drain(c.err, errbuf, cap);
    close(c.out);
    close(c.err);
    int st;
    waitpid(c.pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void check_chat(void)
{
    char errbuf[8192];
    /* history, /reset, /system, --verbose stats per turn, /quit */
    child c = spawn_chat("-n 4 --temp 0 --verbose");
    const char *script = "Hello!\nAnd then?\n/reset\n/system Be brief.\nHi\n/quit\nnever read\n";
    CHECK(write(c.in, script, strlen(script)) == (ssize_t)strlen(script), "write");
    CHECK(finish_chat(c, errbuf, sizeof errbuf) == 0, "chat exits 0: %s", errbuf);
    /* turn 2 reuses turn 1's cache; after /reset a new conversation starts */
    CHECK(strstr(errbuf, "prompt 11 tokens (0 cached)") != NULL, "turn 1 stats: %s", errbuf);
    CHECK(strstr(errbuf, "[history cleared]") && strstr(errbuf, "[system prompt set"), "commands: %s", errbuf);
    const char *t2 = strstr(errbuf, "prompt 11 tokens");
    t2 = t2 ? strstr(t2 + 1, "] prompt ") : NULL;
    int p2 = 0, c2 = 0;
    CHECK(t2 && sscanf(t2, "] prompt %d tokens (%d cached)", &p2, &c2) == 2 && p2 > 11 && c2 >= 11,
          "turn 2 keeps the history and reuses the cache: %d tokens, %d cached", p2, c2);
    /* Ctrl-C stops the reply and returns to the prompt; end of input exits */
    c = spawn_chat("--ignore-eos --temp 0 --ctx 8000");
    CHECK(write(c.in, "Tell me everything.\n", 20) == 20, "write");
    char first[64];
    CHECK(read(c.out, first, sizeof first) > 0, "the reply streams"); /* handler installed by now */
    kill(c.pid, SIGINT);
    usleep(100000);
    CHECK(write(c.in, "/quit\n", 6) == 6, "write");
    CHECK(finish_chat(c, errbuf, sizeof errbuf) == 0, "chat exits 0 after Ctrl-C: %s", errbuf);
    CHECK(strstr(errbuf, "[stopped]") != NULL, "the reply was stopped: %s", errbuf);
}

/* lmx bench --json on the CPU: the run it was asked for, measured; on
 * CUDA: the same where a GPU is present, else a failure naming the device. */
static void check_bench(void)
{
    char *out = NULL, cmd[2048];
    for (int cuda = 0; cuda < 2; cuda++) {
        const char *dev = cuda ? "cuda" : "cpu";
        snprintf(cmd, sizeof cmd, "%s bench %s --device %s --prompt 8 --gen 4 --json 2>&1", LMX_BIN, QWEN, dev);
        int rc = test_run(cmd, &out);
        if (cuda && rc == 1) { /* no GPU here */
            CHECK(out && strstr(out, "device cuda"), "bench on cuda without a GPU: %s", out ? out : "");
            free(out);
            continue;
        }
        cJSON *j = rc == 0 && out ? cJSON_Parse(out) : NULL;
        CHECK(j != NULL, "%s: rc %d, %s", cmd, rc, out ? out : "");
        cJSON *d = cJSON_GetObjectItem(j, "device"), *p = cJSON_GetObjectItem(j, "prompt"),
              *g = cJSON_GetObjectItem(j, "gen");
        CHECK(cJSON_IsString(d) && !strcmp(d->valuestring, dev) && cJSON_IsNumber(p) && p->valueint == 8 &&
                  cJSON_IsNumber(g) && g->valueint == 4,
              "bench on %s: the run asked for: %s", dev, out ? out : "");
        const char *rates[] = {"prefill_tok_s", "decode_tok_s", "weight_bytes_per_token", "bandwidth_bytes_s",
                               "decode_bandwidth_ratio"};
        for (int i = 0; i < 5; i++) {
            cJSON *r = cJSON_GetObjectItem(j, rates[i]);
            CHECK(cJSON_IsNumber(r) && r->valuedouble > 0, "bench on %s: %s measured", dev, rates[i]);
        }
        cJSON_Delete(j);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "%s bench %s --device gpu 2>&1", LMX_BIN, QWEN);
    CHECK(test_run(cmd, &out) == 2 && out && strstr(out, "--device 'gpu'"), "bad --device: %s", out ? out : "");
    free(out);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    check_bench();
    check_run();
    check_template();
    check_chat();
    return test_finish();
}
