//! Tests of `region`.

use super::*;

fn reason(input: &str) -> &'static str {
    match input.parse::<IamRegion>() {
        Ok(region) => panic!("{input:?} parsed as {region}"),
        Err(error) => {
            assert_eq!(error.input, input);
            error.reason
        }
    }
}

#[test]
fn valid_names_parse_and_display_as_given() {
    let longest = format!("{}-{}", "a".repeat(31), "9".repeat(31));
    assert_eq!(longest.len(), 63);
    for input in ["us-east-1", "eu-west-1", "a", "0", "a-b", "1a", "a--b", longest.as_str()] {
        let region: IamRegion = input.parse().unwrap_or_else(|error| panic!("{input:?}: {error}"));
        assert_eq!(region.as_str(), input);
        assert_eq!(region.to_string(), input);
    }
}

#[test]
fn empty_is_refused() {
    assert_eq!(reason(""), "it is empty");
}

#[test]
fn sixty_four_characters_are_refused() {
    assert_eq!(reason(&"a".repeat(64)), "it is longer than 63 characters");
    assert!("a".repeat(63).parse::<IamRegion>().is_ok());
}

#[test]
fn a_leading_or_trailing_hyphen_is_refused() {
    assert_eq!(reason("-us-east-1"), "it starts with a hyphen");
    assert_eq!(reason("us-east-1-"), "it ends with a hyphen");
    assert_eq!(reason("-"), "it starts with a hyphen");
}

#[test]
fn characters_outside_the_grammar_are_refused_by_name() {
    assert_eq!(reason("US-East"), "upper-case letters are not allowed");
    assert_eq!(reason("us_east_1"), "underscores are not allowed");
    assert_eq!(reason("us east 1"), "spaces are not allowed");
    assert_eq!(reason(" us-east-1"), "spaces are not allowed");
    assert_eq!(reason("us.east.1"), "dots are not allowed");
    assert_eq!(reason("us-öst-1"), "non-ASCII characters are not allowed");
    assert_eq!(reason("us/east"), "only lower-case letters, digits and hyphens are allowed");
}

#[test]
fn the_message_names_the_input_the_reason_and_the_grammar() {
    let error = "US-East".parse::<IamRegion>().expect_err("upper case is refused");
    assert_eq!(
        error.to_string(),
        "invalid iamRegion \"US-East\": upper-case letters are not allowed; a region is 1 to 63 lower-case \
         letters, digits and hyphens, starting and ending with a letter or digit, such as us-east-1"
    );
}

#[test]
fn serde_round_trips_as_a_string_and_validates_on_read() {
    let region: IamRegion = "us-east-1".parse().expect("valid");
    let bytes = rmp_serde::to_vec_named(&region).expect("encode");
    assert_eq!(rmp_serde::from_slice::<String>(&bytes).expect("a string"), "us-east-1");
    assert_eq!(rmp_serde::from_slice::<IamRegion>(&bytes).expect("decode"), region);

    let bad = rmp_serde::to_vec_named("US-East").expect("encode");
    let error = rmp_serde::from_slice::<IamRegion>(&bad).expect_err("upper case is refused");
    assert!(error.to_string().contains("upper-case letters are not allowed"), "{error}");
}

#[test]
fn try_from_string_keeps_the_input() {
    let error = IamRegion::try_from("bad_region".to_owned()).expect_err("underscore is refused");
    assert_eq!(error.input, "bad_region");
    assert_eq!(String::from(IamRegion::try_from("ok-1".to_owned()).expect("valid")), "ok-1");
}
