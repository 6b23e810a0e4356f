// proxy-wasm layer: filled in below.
