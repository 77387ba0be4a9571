use loops::Schema;

#[derive(Schema)]
union Bits {
    int: u32,
    float: f32,
}

fn main() {}
