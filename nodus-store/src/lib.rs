//! Store backends for Nodus.
