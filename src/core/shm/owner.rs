//! Users by name and by uid: `rate_ctl_shm_owner`'s argument and the
//! owners named in the file layer's errors.

/// The uid of a user name, or of a number (`rate_ctl_shm_owner`).
pub fn uid_of(name: &str) -> Option<u32> {
    if let Ok(n) = name.parse::<u32>() {
        return Some(n);
    }
    let c = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: a zeroed passwd is a valid out-parameter.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call; buf.len() is its size.
    let rc = unsafe {
        libc::getpwnam_r(
            c.as_ptr(),
            &mut pw,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut out,
        )
    };
    (rc == 0 && !out.is_null()).then_some(pw.pw_uid)
}

/// A user name for log lines: `name (uid N)`, or `uid N`.
pub fn user_name(uid: u32) -> String {
    let mut buf = vec![0u8; 4096];
    // SAFETY: a zeroed passwd is a valid out-parameter; buf outlives the call.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call; buf.len() is its size.
    let rc =
        unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
    if rc == 0 && !out.is_null() && !pw.pw_name.is_null() {
        // SAFETY: getpwuid_r filled pw_name with a NUL-terminated string in buf.
        let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
        return format!("{} (uid {uid})", name.to_string_lossy());
    }
    format!("uid {uid}")
}
