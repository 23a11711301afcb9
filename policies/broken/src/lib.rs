//! A fixture that does not satisfy the world: it exports `tollgate:policy/decide` with a
//! `describe` of the wrong type and none of the other functions. The host must refuse it.

wit_bindgen::generate!({
    inline: "
        package tollgate:policy@0.1.0;
        interface decide {
            describe: func() -> string;
        }
        world policy {
            export decide;
        }
    ",
});

struct Broken;

impl exports::tollgate::policy::decide::Guest for Broken {
    fn describe() -> String {
        "broken".into()
    }
}

export!(Broken);
