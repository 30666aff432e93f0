//! From a blob store's URL to an `object_store` backend.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use crate::{BlobError, Credentials, Result};

/// Attempts at a call the store failed with a transient error, and how long they may take in
/// all: an unreachable store is reported, and a snapshot stays local, within seconds.
const RETRIES: usize = 2;
const RETRY_FOR: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The store `url` names, and whether it is a directory (where a rename is a rename, not a
/// copy).
pub(crate) fn open(url: &str, credentials: Option<Credentials>) -> Result<(Arc<dyn ObjectStore>, bool)> {
    let bad = |reason: &str| BlobError::BadUrl { url: url.into(), reason: reason.into() };
    if url.starts_with('/') {
        return Ok((local(url, url)?, true));
    }
    let parsed =
        url::Url::parse(url).map_err(|e| bad(&format!("{e}; give a directory or s3://BUCKET?endpoint=URL")))?;
    match parsed.scheme() {
        "file" if parsed.host_str().is_none_or(str::is_empty) => Ok((local(url, parsed.path())?, true)),
        "file" => Err(bad("a file URL names a directory on this host: file:///path")),
        "s3" => Ok((s3(url, &parsed, credentials)?, false)),
        other => Err(bad(&format!("unknown scheme {other:?}; use a directory or s3://BUCKET?endpoint=URL"))),
    }
}

fn local(url: &str, dir: &str) -> Result<Arc<dyn ObjectStore>> {
    std::fs::create_dir_all(dir).map_err(|source| BlobError::Io { path: dir.into(), source })?;
    let store = LocalFileSystem::new_with_prefix(dir)
        .map_err(|e| BlobError::BadUrl { url: url.into(), reason: e.to_string() })?
        // Empty directories left by deleted objects go with them.
        .with_automatic_cleanup(true);
    Ok(Arc::new(store))
}

fn s3(url: &str, parsed: &url::Url, credentials: Option<Credentials>) -> Result<Arc<dyn ObjectStore>> {
    let bad = |reason: &str| BlobError::BadUrl { url: url.into(), reason: reason.into() };
    let bucket =
        parsed.host_str().filter(|b| !b.is_empty()).ok_or_else(|| bad("no bucket: s3://BUCKET?endpoint=URL"))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad("credentials do not belong in the URL: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"));
    }
    // Explicit keys only: without them object_store would ask a cloud's metadata service,
    // which is not where a self-hosted cluster keeps them.
    let credentials =
        credentials.ok_or_else(|| bad("no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"))?;
    let mut builder = AmazonS3Builder::new()
        .with_access_key_id(credentials.access_key_id)
        .with_secret_access_key(credentials.secret_access_key)
        .with_bucket_name(bucket)
        .with_retry(RetryConfig { max_retries: RETRIES, retry_timeout: RETRY_FOR, ..RetryConfig::default() })
        .with_client_options(ClientOptions::new().with_connect_timeout(CONNECT_TIMEOUT));
    let mut region = None;
    for (name, value) in parsed.query_pairs() {
        match &*name {
            "endpoint" => {
                builder = builder.with_allow_http(value.starts_with("http://")).with_endpoint(value.into_owned());
            }
            "region" => region = Some(value.into_owned()),
            other => return Err(bad(&format!("unknown parameter {other:?}; known: endpoint, region"))),
        }
    }
    // S3-compatible servers take any region; AWS's own needs the bucket's.
    builder = builder.with_region(region.unwrap_or_else(|| "us-east-1".into()));
    let store = builder.build().map_err(|e| bad(&e.to_string()))?;
    let prefix = parsed.path().trim_matches('/');
    Ok(if prefix.is_empty() { Arc::new(store) } else { Arc::new(PrefixStore::new(store, prefix)) })
}
