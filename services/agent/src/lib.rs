//! leasehold agent runtime (being built).
