//! `bcd ramdisk`: see the module's functions.
