//! The native encoder against the candle reference, in f32, on the real
//! default model: every text's two vectors point the same way.

use std::path::PathBuf;

use fanfold_embed::{Backend, Embedder, EmbedderFiles, cosine};

/// The default model's folder in fanfold's model cache, found the way
/// `fanfold model fetch` stores it (`$FANFOLD_MODEL_DIR`, else the XDG or
/// home cache).
fn model_files() -> EmbedderFiles {
    let root = std::env::var_os("FANFOLD_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"))
                .join("fanfold")
                .join("models")
        });
    let files = EmbedderFiles::in_dir(&root.join("all-MiniLM-L6-v2"));
    assert!(
        files.weights.is_file(),
        "the default embedder is available at {} (run `fanfold model fetch`)",
        files.weights.display()
    );
    files
}

fn texts() -> Vec<String> {
    let long_issue = "After upgrading to 2.4 the scheduler deadlocks when two writers \
        flush the cache at once; the stack shows both threads parked in \
        `Pool::acquire` and the watchdog never fires. "
        .repeat(30);
    let mut texts: Vec<String> = [
        "",
        "a",
        "crash",
        "?",
        "🙂",
        "NullPointerException",
        "Build fails on Windows since the last release.",
        "Memory leak in the HTTP client when connections are reset by the peer.",
        "kernel: EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm ls",
        "RAS KERNEL FATAL data TLB error interrupt",
        "fn main() { let x: Vec<u8> = vec![0; 1 << 20]; println!(\"{}\", x.len()); }",
        "Traceback (most recent call last):\n  File \"app.py\", line 3, in <module>\n    import numpy\nModuleNotFoundError: No module named 'numpy'",
        "Die Anwendung stürzt beim Start ab, wenn die Konfigurationsdatei fehlt.",
        "应用程序在启动时崩溃",
        "Feature request: dark mode for the settings page",
        "Docs: the README's install command is wrong for macOS arm64",
        "flaky test test_retry_backoff times out on CI about one run in ten",
        "UPPER CASE TITLE WITH NUMBERS 12345 AND SYMBOLS #$%&",
        "   leading and trailing whitespace   ",
        "https://example.com/issues/42?tab=comments#c7",
        "duplicate of the login timeout report",
        "The quick brown fox jumps over the lazy dog. ",
        "error: linker `cc` not found\n  |\n  = note: No such file or directory (os error 2)",
        "Segfault in libssl when the handshake is interrupted by SIGPIPE",
        "question: how do I configure the proxy?",
        "thanks!",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    texts.push(long_issue.clone());
    texts.push(long_issue[..600].to_string());
    texts.push("word ".repeat(400));
    texts.push("The quick brown fox jumps over the lazy dog. ".repeat(12));
    texts
}

#[test]
fn native_encoder_agrees_with_candle_reference() {
    let files = model_files();
    let texts = texts();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for max_tokens in [256, 64] {
        let native = Embedder::load_with(&files, max_tokens, Backend::Native).expect("loads");
        let candle = Embedder::load_with(&files, max_tokens, Backend::Candle).expect("loads");
        let (fast, fast_usage) = native.embed(&refs).expect("native embeds");
        let (reference, ref_usage) = candle.embed(&refs).expect("candle embeds");
        assert_eq!(fast_usage, ref_usage);
        assert!(
            fast_usage.truncated >= 2,
            "long texts are cut at {max_tokens}: {fast_usage:?}"
        );
        let lens: Vec<usize> = native
            .token_ids(&refs)
            .expect("tokenizes")
            .iter()
            .map(Vec::len)
            .collect();
        assert!(
            lens.contains(&2),
            "the empty text is its two special tokens"
        );
        assert!(lens.contains(&3), "a one-token text is present");
        assert!(lens.contains(&max_tokens), "a text fills the window");
        for ((text, a), b) in texts.iter().zip(&fast).zip(&reference) {
            assert_eq!(a.len(), 384);
            let norm: f32 = a.iter().map(|v| v * v).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "{text:?}: norm {norm}");
            let c = cosine(a, b);
            assert!(c >= 0.999, "{text:?} at {max_tokens} tokens: cosine {c}");
        }
        // The vectors carry meaning, not just agreement: related texts sit
        // closer than unrelated ones.
        let related = cosine(&fast[7], &fast[23]);
        let unrelated = cosine(&fast[7], &fast[14]);
        assert!(related > unrelated, "{related} <= {unrelated}");
    }
}

#[test]
fn native_encoder_is_order_independent() {
    let files = model_files();
    let native = Embedder::load(&files, 128).expect("loads");
    let texts = texts();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let (all, _) = native.embed(&refs).expect("embeds");
    for (i, text) in refs.iter().enumerate().step_by(5) {
        let (alone, _) = native.embed(&[text]).expect("embeds");
        let c = cosine(&all[i], &alone[0]);
        assert!(
            c > 0.99999,
            "{text:?}: batched and alone differ, cosine {c}"
        );
    }
}
