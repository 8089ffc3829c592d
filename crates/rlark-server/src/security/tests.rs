use super::*;

#[test]
fn cluster_ids_and_user_names_are_validated() {
    assert!(validate_cluster_id("edge-1").is_ok());
    for bad in ["", "-a", "a-", "A", "a_b", &"a".repeat(58)] {
        let error = validate_cluster_id(bad).unwrap_err();
        assert_eq!(error.code, 400);
        assert!(error.message.contains("cluster ID"), "{}", error.message);
    }
    assert!(validate_user_name("alice@example.com").is_ok());
    for bad in ["", "a b", "system:admin", "tab\t"] {
        assert_eq!(validate_user_name(bad).unwrap_err().code, 400, "{bad:?}");
    }
}

#[test]
fn roles_map_to_kubernetes_subjects_and_back() {
    let role = CertRole::from_parts("agent", None, Some("edge-1")).unwrap();
    let subject = role.subject();
    assert_eq!(subject.user, "system:rlark:agent:edge-1");
    assert_eq!(subject.groups, ["rlark:agents"]);
    assert_eq!(CertRole::from_identity(&subject), Some(role));
    let viewer = CertRole::from_parts("viewer", Some("bob"), None).unwrap();
    assert_eq!(viewer.subject().groups, [auth::VIEWER_GROUP]);
    assert_eq!(CertRole::from_identity(&viewer.subject()), Some(viewer));
    assert!(CertRole::from_parts("root", Some("x"), None).is_err());
    assert!(CertRole::from_parts("viewer", None, None).is_err());
    assert!(CertRole::from_parts("admin", Some("system:x"), None).is_err());
    assert_eq!(CertRole::from_identity(&Identity::task("ns", "t")), None);
}
