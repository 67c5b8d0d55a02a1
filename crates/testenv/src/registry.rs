//! A read-only container registry (the OCI distribution API's pull side) serving the images of
//! `scripts/node-images`, for real nodes on a machine that reaches no registry. The nodes'
//! containerd use it as the mirror of every registry the images name (`docker.io`,
//! `registry.k8s.io`), so a pod whose image is pulled (`imagePullPolicy: Always`, which a
//! `:latest` tag or none implies, as the README tour's `nginx`) is pulled as it would be from
//! the real registry: the manifest by tag, then what it names by digest. On a machine that
//! reaches a registry the images would come from there; here they come from the archives.
//!
//! Written here rather than taken from a crate: no Rust crate serves a registry from OCI
//! layouts, and the pull side is three routes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio_util::sync::CancellationToken;

/// The registry could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// An archive or its index could not be read.
    #[error("image registry: {path}: {detail}")]
    Archive {
        /// Which file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// It could not listen.
    #[error("image registry: listening on {addr}: {source}")]
    Listen {
        /// Where.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// `/v2/`: the API version check.
    Base,
    /// `/v2/<repository>/manifests/<tag or digest>`.
    Manifest {
        /// The repository (`library/nginx`).
        repository: &'a str,
        /// A tag or a digest.
        reference: &'a str,
    },
    /// `/v2/<repository>/blobs/<digest>`.
    Blob {
        /// The digest (`sha256:...`).
        digest: &'a str,
    },
}

/// Reads a request path; `None` for anything the pull side does not serve.
pub fn route(path: &str) -> Option<Route<'_>> {
    let rest = path.strip_prefix("/v2/")?;
    if rest.is_empty() {
        return Some(Route::Base);
    }
    if let Some((repository, reference)) = rest.rsplit_once("/manifests/") {
        return (!repository.is_empty() && !reference.is_empty() && !reference.contains('/'))
            .then_some(Route::Manifest {
                repository,
                reference,
            });
    }
    let (repository, digest) = rest.rsplit_once("/blobs/")?;
    (!repository.is_empty() && is_digest(digest)).then_some(Route::Blob { digest })
}

fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The full image name a mirror request stands for: containerd names the registry it mirrors
/// in the `ns` query parameter; without it, any registry's image of that repository and tag.
pub fn image_names(repository: &str, tag: &str, ns: Option<&str>) -> Vec<String> {
    match ns {
        Some(host) => vec![format!("{host}/{repository}:{tag}")],
        None => ["docker.io", "registry.k8s.io"]
            .iter()
            .map(|host| format!("{host}/{repository}:{tag}"))
            .collect(),
    }
}

/// A manifest as the index of its archive names it.
#[derive(Clone, Debug)]
struct Manifest {
    digest: String,
    media_type: String,
}

struct Images {
    /// Full name (`docker.io/library/nginx:latest`) to its manifest.
    names: HashMap<String, Manifest>,
    /// The merged blobs of every archive (`blobs/sha256/<hex>`).
    layout: PathBuf,
}

/// A running registry; stops when dropped.
#[derive(Debug)]
pub struct Registry {
    /// Where it listens (plain HTTP).
    pub addr: SocketAddr,
    stop: CancellationToken,
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Unpacks the archives `images_dir/images.txt` lists into `work` and serves them on
/// `listen` (port 0: a free one).
pub async fn start(
    images_dir: &Path,
    work: &Path,
    listen: SocketAddr,
) -> Result<Registry, RegistryError> {
    let archive_error = |path: &Path, detail: String| RegistryError::Archive {
        path: path.to_owned(),
        detail,
    };
    let list = images_dir.join("images.txt");
    let text = std::fs::read_to_string(&list).map_err(|e| archive_error(&list, e.to_string()))?;
    let layout = work.join("layout");
    std::fs::create_dir_all(&layout).map_err(|e| archive_error(&layout, e.to_string()))?;
    let mut names = HashMap::new();
    for archive in text.lines().filter_map(|l| l.split_whitespace().next()) {
        let path = images_dir.join(archive);
        // Blobs are named by their digest, so archives unpack into one folder; each one's
        // index is read before the next overwrites it.
        let out = std::process::Command::new("tar")
            .arg("-xf")
            .arg(&path)
            .arg("-C")
            .arg(&layout)
            .output()
            .map_err(|e| archive_error(&path, format!("running tar: {e}")))?;
        if !out.status.success() {
            return Err(archive_error(
                &path,
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ));
        }
        let index_path = layout.join("index.json");
        let index: serde_json::Value = std::fs::read(&index_path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            .map_err(|e| archive_error(&path, format!("index.json: {e}")))?;
        for m in index["manifests"].as_array().into_iter().flatten() {
            let (Some(name), Some(digest), Some(media_type)) = (
                m["annotations"]["io.containerd.image.name"].as_str(),
                m["digest"].as_str(),
                m["mediaType"].as_str(),
            ) else {
                continue;
            };
            names.insert(
                name.to_owned(),
                Manifest {
                    digest: digest.to_owned(),
                    media_type: media_type.to_owned(),
                },
            );
        }
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| RegistryError::Listen {
            addr: listen,
            source,
        })?;
    let addr = listener
        .local_addr()
        .map_err(|source| RegistryError::Listen {
            addr: listen,
            source,
        })?;
    let images = Arc::new(Images { names, layout });
    let stop = CancellationToken::new();
    tokio::spawn(serve(listener, images, stop.clone()));
    Ok(Registry { addr, stop })
}

async fn serve(listener: tokio::net::TcpListener, images: Arc<Images>, stop: CancellationToken) {
    let mut errors = tensile_runtime::tls::AcceptErrors::new("image registry");
    loop {
        let (tcp, _) = tokio::select! {
            () = stop.cancelled() => return,
            c = tensile_runtime::tls::accept_backing_off(&listener, &mut errors) => c,
        };
        let (images, stop) = (images.clone(), stop.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let images = images.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&images, &req).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(tcp), service);
            tokio::select! {
                _ = conn => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({"errors": [{"code": code, "message": message}]}).to_string();
    let mut res = Response::new(Full::new(Bytes::from(body)));
    *res.status_mut() = status;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    res
}

async fn answer<B>(images: &Images, req: &http::Request<B>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
            "a read-only registry",
        );
    }
    let ns = req.uri().query().and_then(|q| {
        q.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == "ns")
            .map(|(_, v)| v)
    });
    let (digest, media_type) = match route(req.uri().path()) {
        None => return error(StatusCode::NOT_FOUND, "NAME_UNKNOWN", "no such route"),
        Some(Route::Base) => {
            let mut res = Response::new(Full::new(Bytes::from_static(b"{}")));
            res.headers_mut().insert(
                "Docker-Distribution-API-Version",
                http::HeaderValue::from_static("registry/2.0"),
            );
            return res;
        }
        Some(Route::Manifest {
            repository,
            reference,
        }) => {
            if is_digest(reference) {
                // A manifest by digest: the media type is the one its own bytes declare.
                let media_type = blob(images, reference)
                    .await
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|v| v["mediaType"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| "application/vnd.oci.image.manifest.v1+json".into());
                (reference.to_owned(), media_type)
            } else {
                match image_names(repository, reference, ns)
                    .iter()
                    .find_map(|n| images.names.get(n))
                {
                    Some(m) => (m.digest.clone(), m.media_type.clone()),
                    None => {
                        return error(
                            StatusCode::NOT_FOUND,
                            "MANIFEST_UNKNOWN",
                            &format!("{repository}:{reference} is not among the imported images"),
                        );
                    }
                }
            }
        }
        Some(Route::Blob { digest }) => (digest.to_owned(), "application/octet-stream".into()),
    };
    let Some(bytes) = blob(images, &digest).await else {
        return error(StatusCode::NOT_FOUND, "BLOB_UNKNOWN", &digest);
    };
    let len = bytes.len();
    let mut res = Response::new(Full::new(if req.method() == Method::HEAD {
        Bytes::new()
    } else {
        Bytes::from(bytes)
    }));
    let headers = res.headers_mut();
    for (name, value) in [
        ("Content-Type", media_type),
        ("Docker-Content-Digest", digest),
        ("Content-Length", len.to_string()),
    ] {
        if let Ok(v) = http::HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    }
    res
}

async fn blob(images: &Images, digest: &str) -> Option<Vec<u8>> {
    let hex = digest.strip_prefix("sha256:")?;
    if !is_digest(digest) {
        return None;
    }
    tokio::fs::read(images.layout.join("blobs/sha256").join(hex))
        .await
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_of_the_pull_side() {
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(route("/v2/"), Some(Route::Base));
        assert_eq!(
            route("/v2/library/nginx/manifests/latest"),
            Some(Route::Manifest {
                repository: "library/nginx",
                reference: "latest"
            })
        );
        assert_eq!(
            route(&format!("/v2/e2e-test-images/agnhost/blobs/{d}")),
            Some(Route::Blob { digest: &d })
        );
        for bad in [
            "/v2",
            "/v1/",
            "/v2/x/blobs/sha256:abc",
            "/v2//manifests/latest",
            "/v2/x/manifests/",
            "/v2/x/blobs/../../etc/passwd",
            "/v2/x/tags/list",
        ] {
            assert_eq!(route(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_mirror_request_names_its_registry() {
        assert_eq!(
            image_names("library/nginx", "latest", Some("docker.io")),
            vec!["docker.io/library/nginx:latest"]
        );
        assert_eq!(
            image_names("pause", "3.10.1", None),
            vec!["docker.io/pause:3.10.1", "registry.k8s.io/pause:3.10.1"]
        );
    }
}
