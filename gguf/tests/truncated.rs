//! A cut model file (an interrupted download) is reported with the file's real size, the size
//! its tensors need and the first tensor it cuts (issue 30, item 13): before, the message named
//! only the first cut tensor's byte range, so the bytes missing had to be worked out by hand.
use hypura_gguf::testing::{smollm2, Model, TempFile};
use hypura_gguf::{GgufError, GgufFile};

/// `bytes` written to a file, opened (the header is whole) and validated.
fn validate(bytes: &[u8]) -> GgufError {
    let file = TempFile::new(bytes);
    let gguf = GgufFile::open(&file.0).expect("the header is whole");
    let err = gguf.validate().expect_err("the file is cut");
    assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
    err
}

#[test]
fn a_cut_synthetic_model_gives_its_size_and_the_size_its_tensors_need() {
    let bytes = Model::valid().bytes();
    let whole = bytes.len();
    let cut = whole - 10;
    let err = validate(&bytes[..cut]);
    let start = whole - 1152;
    let expected = format!(
        " is truncated: the file has {cut} bytes but its tensors need {whole} bytes (10 \
         missing): the first tensor cut is blk.0.ffn_up.weight, bytes {start}..{whole}; \
         re-download it"
    );
    assert!(err.to_string().ends_with(&expected), "{err}");
}

#[test]
fn a_file_cut_before_its_tensor_data_says_where_the_data_starts() {
    let bytes = Model::valid().bytes();
    let whole = bytes.len();
    // The header ends before the data's alignment padding: keep the header, drop the rest.
    let gguf = {
        let file = TempFile::new(&bytes);
        GgufFile::open(&file.0).unwrap()
    };
    let data_offset = gguf.data_offset() as usize;
    let header_end = (0..data_offset)
        .rev()
        .find(|&n| {
            let file = TempFile::new(&bytes[..n]);
            GgufFile::open(&file.0).is_err()
        })
        .unwrap()
        + 1;
    assert!(header_end < data_offset, "{header_end} {data_offset}");
    let err = validate(&bytes[..header_end]);
    assert!(
        err.to_string().contains(&format!(
            "is truncated: the file has {header_end} bytes but its tensors need {whole} bytes \
             ({} missing): tensor data should start at byte {data_offset}",
            whole - header_end
        )),
        "{err}"
    );
}

#[test]
fn a_cut_smollm2_gives_its_real_size() {
    let bytes = std::fs::read(smollm2()).unwrap();
    let whole = bytes.len();
    assert_eq!(whole, 98_362_432);
    let err = validate(&bytes[..50_000_000]);
    let message = err.to_string();
    assert!(
        message.contains(&format!(
            "is truncated: the file has 50000000 bytes but its tensors need {whole} bytes \
             (48362432 missing): the first tensor cut is blk.16.ffn_down.weight, bytes \
             49600576..50153536; re-download it"
        )),
        "{message}"
    );
}
