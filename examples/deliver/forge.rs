//! A local forge: pull requests kept as JSON files in a directory, served the way a
//! GitHub-like API would serve them.
//!
//! Like such an API, it takes an idempotency key with a request to open a pull request: a
//! second request with the same key opens nothing and returns the pull request the first one
//! opened. And like a real server, it writes each pull request atomically (a temporary file,
//! synced, then renamed into place), so a crash leaves either the whole pull request or none.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde::{Deserialize, Serialize};

use crate::git::Git;

/// A pull request as the forge stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRequest {
    /// Its number, from 1.
    pub number: u64,
    /// Its address.
    pub url: String,
    /// Title.
    pub title: String,
    /// Description.
    pub body: String,
    /// The branch it merges into.
    pub base: String,
    /// The branch it merges.
    pub head: String,
    /// The commit `head` pointed at when it was opened.
    pub head_commit: String,
    /// The idempotency key of the request that opened it.
    pub idempotency_key: String,
}

/// A request to open a pull request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPullRequest {
    /// Title.
    pub title: String,
    /// Description.
    pub body: String,
    /// The branch it merges into.
    pub base: String,
    /// The branch it merges; it must have been pushed.
    pub head: String,
    /// The commit `head` must point at.
    pub head_commit: String,
}

/// The answer to a request to open a pull request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opened {
    /// The pull request.
    pub pull_request: PullRequest,
    /// `false` if a request with the same idempotency key had opened it already.
    pub created: bool,
}

/// The forge of one repository.
#[derive(Debug, Clone)]
pub struct Forge {
    pulls: PathBuf,
    remote: Git,
    project: String,
}

impl Forge {
    /// The forge kept in `dir`, for the bare repository `remote`, whose pull request
    /// addresses read `forge://{project}/pulls/{number}`.
    ///
    /// # Errors
    /// If the directory cannot be created.
    pub fn open(dir: &Path, remote: &Path, project: &str) -> Result<Forge> {
        let pulls = dir.join("pulls");
        std::fs::create_dir_all(&pulls)
            .with_context(|| format!("cannot create {}", pulls.display()))?;
        Ok(Forge {
            pulls,
            remote: Git::new(remote),
            project: project.to_owned(),
        })
    }

    /// The file pull request `number` is kept in.
    pub fn path_of(&self, number: u64) -> PathBuf {
        self.pulls.join(format!("{number}.json"))
    }

    /// Every pull request, by number.
    ///
    /// # Errors
    /// If the directory or a pull request cannot be read.
    pub fn pull_requests(&self) -> Result<Vec<PullRequest>> {
        let mut all = Vec::new();
        let entries = std::fs::read_dir(&self.pulls)
            .with_context(|| format!("cannot read {}", self.pulls.display()))?;
        for entry in entries {
            let path = entry
                .with_context(|| format!("cannot read {}", self.pulls.display()))?
                .path();
            // Temporary files of interrupted writes start with a dot and are not pull requests.
            let is_pull = path.extension().is_some_and(|e| e == "json")
                && path
                    .file_stem()
                    .is_some_and(|s| s.to_string_lossy().parse::<u64>().is_ok());
            if !is_pull {
                continue;
            }
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let pull: PullRequest = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a pull request", path.display()))?;
            all.push(pull);
        }
        all.sort_by_key(|p| p.number);
        Ok(all)
    }

    /// Opens a pull request, at most once per `idempotency_key`.
    ///
    /// If a pull request was opened with this key, it is returned (`created: false`) and
    /// nothing changes. Otherwise the request must name a pushed branch at the given commit,
    /// and no other pull request may be open for that branch (as on GitHub).
    ///
    /// # Errors
    /// If the branch is not pushed at `head_commit`, another pull request has the same head
    /// branch, or the forge's files cannot be read or written.
    pub async fn open_pull_request(
        &self,
        request: &NewPullRequest,
        idempotency_key: &str,
    ) -> Result<Opened> {
        let existing = self.pull_requests()?;
        if let Some(pull) = existing
            .iter()
            .find(|p| p.idempotency_key == idempotency_key)
        {
            return Ok(Opened {
                pull_request: pull.clone(),
                created: false,
            });
        }
        if let Some(pull) = existing.iter().find(|p| p.head == request.head) {
            bail!(
                "a pull request for branch {} exists already (#{}, opened with another \
                 idempotency key)",
                request.head,
                pull.number
            );
        }
        let pushed = self
            .remote
            .resolve(&format!("refs/heads/{}", request.head))
            .await?;
        if pushed.as_deref() != Some(request.head_commit.as_str()) {
            bail!(
                "branch {} is not pushed at {} (the remote has {})",
                request.head,
                request.head_commit,
                pushed.as_deref().unwrap_or("no such branch")
            );
        }
        let number = existing.last().map_or(1, |p| p.number + 1);
        let pull = PullRequest {
            number,
            url: format!("forge://{}/pulls/{number}", self.project),
            title: request.title.clone(),
            body: request.body.clone(),
            base: request.base.clone(),
            head: request.head.clone(),
            head_commit: request.head_commit.clone(),
            idempotency_key: idempotency_key.to_owned(),
        };
        let json = serde_json::to_vec_pretty(&pull).context("cannot encode the pull request")?;
        write_atomically(&self.path_of(number), &json)?;
        tracing::info!(number, key = idempotency_key, "pull request opened");
        Ok(Opened {
            pull_request: pull,
            created: true,
        })
    }
}

/// Writes `bytes` to `path` so that readers see the old file or the whole new one: a
/// temporary file in the same directory, synced, then renamed over `path`.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .with_context(|| format!("{} has no parent directory", path.display()))?;
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let mut file =
        std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    drop(file);
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forge over a bare repository holding branch `work` (and an empty commit).
    async fn forge(dir: &Path) -> (Forge, String) {
        let repo = Git::new(dir.join("repo"));
        std::fs::create_dir_all(repo.dir()).unwrap();
        repo.run(&["init", "--quiet"]).await.unwrap();
        repo.run(&["commit", "--quiet", "--allow-empty", "-m", "c"])
            .await
            .unwrap();
        let commit = repo.rev_parse("HEAD").await.unwrap();
        let remote = dir.join("remote.git");
        Git::new(dir)
            .run(&["init", "--quiet", "--bare", "remote.git"])
            .await
            .unwrap();
        repo.push(&remote, &commit, "work").await.unwrap();
        let forge = Forge::open(&dir.join("forge"), &remote, "demo").unwrap();
        (forge, commit)
    }

    fn request(head: &str, commit: &str) -> NewPullRequest {
        NewPullRequest {
            title: "Fix".into(),
            body: "Body".into(),
            base: "main".into(),
            head: head.into(),
            head_commit: commit.into(),
        }
    }

    #[tokio::test]
    async fn the_same_key_opens_one_pull_request() {
        let dir = tempfile::tempdir().unwrap();
        let (forge, commit) = forge(dir.path()).await;
        let first = forge
            .open_pull_request(&request("work", &commit), "lk-a")
            .await
            .unwrap();
        assert!(first.created);
        assert_eq!(first.pull_request.number, 1);
        assert_eq!(first.pull_request.url, "forge://demo/pulls/1");
        let again = forge
            .open_pull_request(&request("work", &commit), "lk-a")
            .await
            .unwrap();
        assert!(!again.created);
        assert_eq!(again.pull_request, first.pull_request);
        assert_eq!(forge.pull_requests().unwrap(), vec![first.pull_request]);
        // Nothing but the pull request is left in the directory.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("forge/pulls"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["1.json"]);
    }

    #[tokio::test]
    async fn another_key_for_the_same_branch_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (forge, commit) = forge(dir.path()).await;
        forge
            .open_pull_request(&request("work", &commit), "lk-a")
            .await
            .unwrap();
        let err = forge
            .open_pull_request(&request("work", &commit), "lk-b")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("exists already (#1"), "{err}");
    }

    #[tokio::test]
    async fn an_unpushed_branch_is_refused_and_leftovers_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (forge, commit) = forge(dir.path()).await;
        // What a write interrupted before its rename leaves behind.
        std::fs::write(dir.path().join("forge/pulls/.1.json.tmp-99"), "{").unwrap();
        let err = forge
            .open_pull_request(&request("elsewhere", &commit), "lk-a")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("is not pushed"), "{err}");
        assert!(forge.pull_requests().unwrap().is_empty());
    }
}
