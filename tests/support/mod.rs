pub mod wheel_model;
