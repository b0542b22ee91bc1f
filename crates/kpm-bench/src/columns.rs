//! Text tables: rows under headers, in columns, for `report` and the soak's
//! report.

/// `rows` under `headers`, in columns two spaces apart.
pub(crate) fn columns(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::NOTHING).set_header(headers).add_rows(rows);
    table.column_iter_mut().for_each(|column| {
        column.set_padding((0, 2));
    });
    table.trim_fmt()
}
