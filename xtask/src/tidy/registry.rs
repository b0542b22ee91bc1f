//! The registry's and docs.rs's metadata of every published crate.

use super::workspace::Crate;

/// What every published crate's manifest sets, so that its page on the
/// registry reads alike: `readme` names a file that exists.
const REGISTRY_METADATA: &[&str] =
    &["description", "repository", "readme", "keywords", "categories"];

/// What a published library sets besides, for its docs.rs page.
const DOCS_METADATA: &[&str] = &["documentation", "[package.metadata.docs.rs]"];

/// Every published crate sets `REGISTRY_METADATA`, a library `DOCS_METADATA`
/// too.
pub(super) fn check_registry_metadata(crates: &[Crate], problems: &mut Vec<String>) {
    for krate in crates.iter().filter(|krate| krate.published) {
        let docs = if krate.library { DOCS_METADATA } else { &[] };
        for key in REGISTRY_METADATA.iter().chain(docs).filter(|key| !krate.metadata.contains(key))
        {
            problems.push(format!(
                "{} is published (no `publish = false`) but its Cargo.toml lacks `{key}` \
                 (see kpm-cache's)",
                krate.name
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tidy::layers::fixtures::workspace;

    #[test]
    fn a_published_crate_carries_the_registry_metadata() {
        let mut crates = workspace("kpm", None);
        let mut problems = Vec::new();
        check_registry_metadata(&crates, &mut problems);
        assert!(problems.is_empty(), "unpublished crates need none: {problems:?}");
        let all: Vec<&str> = REGISTRY_METADATA.iter().chain(DOCS_METADATA).copied().collect();
        for krate in &mut crates {
            krate.published = true;
            krate.metadata.clone_from(&all);
        }
        check_registry_metadata(&crates, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        crates[0].metadata.retain(|key| *key != "readme");
        crates[1].library = false;
        crates[1].metadata.retain(|key| !DOCS_METADATA.contains(key));
        check_registry_metadata(&crates, &mut problems);
        assert_eq!(
            problems,
            ["kpm-api is published (no `publish = false`) but its Cargo.toml lacks `readme` \
              (see kpm-cache's)"]
        );
    }
}
